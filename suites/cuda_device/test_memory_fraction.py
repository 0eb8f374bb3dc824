"""`torch.cuda.set_per_process_memory_fraction` as CUDA's caching allocator keeps it: one share per
device, and an ordinal without an allocator refused (the emulated device kept one share for every
device and took any ordinal, so a share meant for one GPU of a tensor-parallel rank's host bounded
the others)."""

from __future__ import annotations

import pytest
import torch


def test_a_fraction_for_a_device_that_does_not_exist_is_refused(cuda_kind):
    missing = torch.cuda.device_count()
    with pytest.raises(RuntimeError, match="did you call init"):
        torch.cuda.set_per_process_memory_fraction(0.5, missing)
    with pytest.raises(RuntimeError, match="did you call init"):
        torch.cuda.get_per_process_memory_fraction(missing)
    assert torch.cuda.get_per_process_memory_fraction() == 1.0


def test_each_device_keeps_its_own_fraction(two_devices):
    torch.cuda.set_per_process_memory_fraction(0.25, 1)
    try:
        assert torch.cuda.get_per_process_memory_fraction(1) == 0.25
        assert torch.cuda.get_per_process_memory_fraction(0) == 1.0
        total = torch.cuda.get_device_properties(1).total_memory
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(total // 2, dtype=torch.uint8, device="cuda:1")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 1)
