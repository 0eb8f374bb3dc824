"""`torch.cuda.host_memory_stats()` and its siblings: CUDA's caching host allocator (pinned memory).

Run on the emulated device, natively and in the graph sanitizer (`cuda_kind`). Before
host_allocator.py every call raised AttributeError inside the emulation on a CPU build. Each check
starts from `torch._C._host_emptyCache()`, so blocks cached by earlier tests of the process do not
serve its requests.
"""

from __future__ import annotations

import pytest
import torch

from harness.emulation import emulation_active
from harness.emulation.host_allocator import rounded_size

KEYS = {"allocations", "active_requests", "allocated_bytes", "active_bytes"}


def _stats() -> dict:
    return torch.cuda.memory.host_memory_stats_as_nested_dict()


def _fresh() -> dict:
    torch.ones(1, device="cuda")  # torch answers {} until CUDA is initialized
    torch._C._host_emptyCache()
    return _stats()


def test_the_nested_statistics_have_cudas_shape(cuda_kind):
    stats = _fresh()
    assert set(stats) == KEYS | {"num_host_alloc", "num_host_free", "host_alloc_time",
                                 "host_free_time"}
    for key in KEYS:
        assert set(stats[key]) == {"current", "peak", "allocated", "freed"}
    assert set(stats["host_alloc_time"]) == {"total", "max", "min", "count", "avg"}
    flat = torch.cuda.host_memory_stats()
    assert flat["allocations.current"] == stats["allocations"]["current"]
    assert list(flat) == sorted(flat)


def test_pinned_blocks_are_rounded_to_a_power_of_two_and_counted(cuda_kind):
    before = _fresh()
    held = [torch.empty(1 << 20, pin_memory=True), torch.empty(100, pin_memory=True)]
    after = _stats()
    blocks = (1 << 22) + 512  # 4 MiB, and 400 bytes rounded up to 512
    assert after["allocations"]["current"] - before["allocations"]["current"] == 2
    assert after["allocated_bytes"]["current"] - before["allocated_bytes"]["current"] == blocks
    assert after["active_bytes"]["current"] - before["active_bytes"]["current"] == blocks
    assert after["num_host_alloc"] - before["num_host_alloc"] == 2
    assert after["host_alloc_time"]["count"] - before["host_alloc_time"]["count"] == 2
    del held


def test_a_freed_block_serves_the_next_request_of_its_size_and_empty_cache_releases_it(cuda_kind):
    _fresh()
    first = torch.empty(100, pin_memory=True)
    del first
    middle = _stats()
    again = torch.empty(120, pin_memory=True)  # 480 bytes: the same 512-byte block
    reused = _stats()
    assert reused["allocations"]["current"] == middle["allocations"]["current"]
    assert reused["num_host_alloc"] == middle["num_host_alloc"]
    del again
    torch._C._host_emptyCache()
    released = _stats()
    assert released["allocations"]["current"] == middle["allocations"]["current"] - 1
    assert released["num_host_free"] == middle["num_host_free"] + 1


def test_a_free_makes_the_block_inactive(cuda_kind):
    if cuda_kind != "emulated":
        pytest.skip("torch 2.11's CUDA allocator (the GPU machine) leaves the active counts as "
                    "they were when a block is freed; later torch documents the decrease")
    _fresh()
    block = torch.empty(64, pin_memory=True)
    active = _stats()["active_requests"]["current"]
    del block
    assert _stats()["active_requests"]["current"] == active - 1


def test_resets_keep_current_values_and_clear_history(cuda_kind):
    _fresh()
    held = torch.empty(1000, pin_memory=True)
    torch.cuda.reset_accumulated_host_memory_stats()
    stats = _stats()
    assert stats["allocations"]["allocated"] == stats["allocations"]["freed"] == 0
    assert stats["allocations"]["current"] >= 1 and stats["host_alloc_time"]["count"] == 0
    torch.cuda.reset_peak_host_memory_stats()
    stats = _stats()
    assert stats["allocated_bytes"]["peak"] == stats["allocated_bytes"]["current"]
    del held


@pytest.mark.parametrize("nbytes, block", [(1, 1), (400, 512), (512, 512), (513, 1024),
                                           ((1 << 20) + 1, 1 << 21)])
def test_rounded_size(nbytes, block):
    assert rounded_size(nbytes) == block


def test_pinning_memory_initializes_cuda_and_its_statistics(cuda_kind):
    if cuda_kind != "emulated":
        pytest.skip("a fresh process is needed natively: CUDA was initialized by earlier tests")
    if torch.cuda.is_initialized():
        pytest.skip("the session's emulation initialized CUDA before this test")
    assert torch.cuda.host_memory_stats() == {}  # torch's answer before CUDA is initialized
    held = torch.empty(8, pin_memory=True)
    assert torch.cuda.is_initialized()
    assert torch.cuda.host_memory_stats()["allocations.current"] == 1
    del held
