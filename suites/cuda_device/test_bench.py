"""`harness bench emulator`'s table for the emulated CUDA device runs end to end (its own check:
replay through torch.cuda.graph equals eager on the device). Speed is never asserted here."""

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
    assert printed.count(f"| {case} |") == 2  # the replay table and the device table
