"""A process-wide GPU memory cap set with one `torch.cuda.set_per_process_memory_fraction(cap)`
call (unsloth PR #11077, https://github.com/unslothai/unsloth/pull/11077: Studio's training
worker read `UNSLOTH_GPU_MEM_FRACTION` and capped "the GPU memory" so, while its jobs shard a
model over every visible GPU). Without a device the call sets the current device's share only,
as CUDA's caching allocator keeps one per device: `cuda:1` and later stay uncapped, and a job
meant to leave room for another process takes it there. Nothing is refused on CUDA; allocations
past the cap on `cuda:1` go through. Fixed in the PR by passing each device,
`for i in range(torch.cuda.device_count())`.

The emulated device kept one share for every device until branch sweep11, so the buggy cap
bounded `cuda:1` too and this miniature passed where a GPU host ran uncapped. Runs on two
emulated devices, or natively where two GPUs are lent."""

from __future__ import annotations

import pytest
import torch

import harness
from harness.emulation import emulation_active

CAP = 1e-4  # of a device's memory: a few megabytes, so an allocation past it stays small


@pytest.fixture(autouse=True)
def harness_device():
    """Two emulated devices, or CUDA with two GPUs (the conftest's fixture, overridden)."""
    if emulation_active() is None and not torch.cuda.is_available():
        with harness.emulate_cuda(device_count=2):
            yield
        return
    if emulation_active() not in (None, "cpu") or torch.cuda.device_count() < 2:
        pytest.skip("needs two devices: two GPUs natively, or two emulated ones")
    try:
        yield
    finally:
        for index in range(torch.cuda.device_count()):
            torch.cuda.set_per_process_memory_fraction(1.0, index)


def _cap_the_current_device(cap: float) -> None:
    torch.cuda.set_per_process_memory_fraction(cap)


def _cap_every_device(cap: float) -> None:
    for index in range(torch.cuda.device_count()):
        torch.cuda.set_per_process_memory_fraction(cap, index)


def _past_the_cap(device: str) -> torch.Tensor:
    """Four times the cap's bytes on `device`."""
    index = torch.device(device).index
    nbytes = 4 * int(torch.cuda.get_device_properties(index).total_memory * CAP)
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def test_a_cap_without_a_device_leaves_the_second_gpu_uncapped():
    assert torch.cuda.current_device() == 0
    _cap_the_current_device(CAP)
    with pytest.raises(torch.OutOfMemoryError):
        _past_the_cap("cuda:0")
    held = _past_the_cap("cuda:1")  # the bug: the second GPU takes it
    assert held.device == torch.device("cuda:1")
    assert torch.cuda.get_per_process_memory_fraction(1) == 1.0


def test_a_cap_on_every_device_bounds_the_second_gpu():
    _cap_every_device(CAP)
    for device in ("cuda:0", "cuda:1"):
        with pytest.raises(torch.OutOfMemoryError):
            _past_the_cap(device)
