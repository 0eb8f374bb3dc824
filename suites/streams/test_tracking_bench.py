"""`harness bench emulator`'s table of replay with stream tracking on vs off runs end to end.
Speed is never asserted here."""

from __future__ import annotations

import pytest
import torch

from harness.bench import emulator
from harness.emulation import emulation_active


def test_the_tracking_table_is_printed(capsys):
    if emulation_active() is not None or torch.cuda.is_available():
        pytest.skip("enters emulate_cuda(device='cpu') itself, without a GPU")
    argv = ["--iters", "2", "--warmup", "0", "--case", "hand-written decode step", "--no-write",
            "--no-device"]
    assert emulator.main(argv) == 0
    printed = capsys.readouterr().out
    assert "stream tracking on vs off" in printed and "tracked/untracked" in printed
