"""`harness bench emulator`'s tables for the emulated CUDA device run end to end (their own checks:
replay through torch.cuda.graph equals eager on the device; eager with stream tracking on, in issue
order and adversarial, equals CPU eager). Speed is never asserted here."""

from __future__ import annotations

import pytest
import torch

from harness.bench import emulator
from harness.emulation import emulation_active


@pytest.mark.parametrize("case", ["hand-written decode step", "transformers Llama decode step"])
def test_the_device_table_is_printed(case, capsys):
    if emulation_active() is not None or torch.cuda.is_available():
        pytest.skip("enters emulate_cuda(device='cpu') itself, without a GPU")
    assert emulator.main(["--iters", "2", "--warmup", "0", "--case", case, "--no-write"]) == 0
    printed = capsys.readouterr().out
    assert "Eager on the emulated CUDA device vs CPU eager" in printed
    assert "Eager on the emulated CUDA device with stream tracking on" in printed
    # the replay table, the device table and the tracked eager table (issue order, adversarial)
    assert printed.count(f"| {case} |") == 3
