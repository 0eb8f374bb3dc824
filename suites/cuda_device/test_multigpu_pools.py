"""Graph pools, MemPools and the memory history per device, as CUDA's caching allocator keeps them
(one DeviceCachingAllocator per device): a capture allocates from its capture device's pool, a
MemPool is of the device current when it is made, `use_mem_pool(pool, device=i)` routes the
thread's allocations on device i only, and the history is recorded on every device, each in its
own trace. The two-device rows use the `two_devices` fixture (conftest.py: emulated, or a
machine's own two GPUs); the one-device row runs where `cuda_kind` does."""

from __future__ import annotations

import torch

FLOATS = 12345  # a size nothing else here asks for: 49,380 bytes, a block of 49,664
BLOCK = 49664


def _pool_segments(pool_id) -> list[dict]:
    return [s for s in torch.cuda.memory_snapshot() if tuple(s["segment_pool_id"]) == tuple(pool_id)]


def _blocks_of(segments: list[dict], size: int) -> list[dict]:
    return [b for s in segments for b in s["blocks"]
            if b["state"] == "active_allocated" and b["size"] == size]


def test_a_captures_segments_are_named_by_the_pool_id_it_was_given(cuda_kind):
    handle = torch.cuda.graph_pool_handle()
    x = torch.ones(FLOATS, device="cuda")
    stream, graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin(pool=handle)
        y = x * 2
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    assert graph.pool() == handle
    assert len(_blocks_of(_pool_segments(handle), BLOCK)) == 1  # y's block, in the pool
    assert len(_blocks_of(torch.cuda.memory_snapshot(handle), BLOCK)) == 1
    del y, graph


def test_a_capture_on_device_one_allocates_from_device_ones_pool(two_devices):
    with torch.cuda.device(1):
        x = torch.ones(FLOATS, device="cuda")
        stream, graph = torch.cuda.Stream(), torch.cuda.CUDAGraph()
        stream.wait_stream(torch.cuda.current_stream())
        torch.cuda.synchronize()
        reserved = [torch.cuda.memory_reserved(i) for i in (0, 1)]
        allocated = [torch.cuda.memory_allocated(i) for i in (0, 1)]
        with torch.cuda.stream(stream):
            graph.capture_begin()
            y = x * 2
            graph.capture_end()
        torch.cuda.current_stream().wait_stream(stream)
    assert torch.cuda.memory_reserved(0) == reserved[0]
    assert torch.cuda.memory_allocated(0) == allocated[0]
    assert torch.cuda.memory_allocated(1) >= allocated[1] + BLOCK
    segments = _pool_segments(graph.pool())
    assert {s["device"] for s in segments} == {1}
    assert len(_blocks_of(segments, BLOCK)) == 1
    del y, graph


def test_a_mempool_is_of_the_device_current_when_it_is_made(two_devices):
    with torch.cuda.device(1):
        pool = torch.cuda.MemPool()
        before = torch.cuda.memory_allocated(0)
        with torch.cuda.use_mem_pool(pool):
            inside = torch.ones(FLOATS, device="cuda")
    assert str(inside.device) == "cuda:1"
    assert torch.cuda.memory_allocated(0) == before
    segments = pool.snapshot()
    assert {s["device"] for s in segments} == {1}
    assert len(_blocks_of(segments, BLOCK)) == 1
    del inside


def test_use_mem_pool_on_a_device_routes_only_that_devices_allocations(two_devices):
    pool = torch.cuda.MemPool()  # of device 0
    with torch.cuda.use_mem_pool(pool, device=1):
        on_one = torch.ones(FLOATS, device="cuda:1")
        on_zero = torch.ones(FLOATS, device="cuda:0")
    segments = torch.cuda.memory_snapshot(pool.id)
    # device 1's pool of the id holds on_one; device 0's allocation went to its regular pool
    assert {s["device"] for s in segments} == {1}
    assert len(_blocks_of(segments, BLOCK)) == 1
    regular_zero = [s for s in torch.cuda.memory_snapshot()
                    if s["device"] == 0 and tuple(s["segment_pool_id"]) == (0, 0)]
    assert len(_blocks_of(regular_zero, BLOCK)) >= 1
    del on_one, on_zero


def test_the_memory_history_records_each_devices_allocations_in_its_own_trace(two_devices):
    torch.cuda.memory._record_memory_history(max_entries=1000)
    try:
        on_one = torch.ones(FLOATS, device="cuda:1")
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(None)
    traces = snapshot["device_traces"]
    assert len(traces) >= 2

    def allocs(trace):
        return [e for e in trace if e["action"] == "alloc" and e["size"] == BLOCK]

    assert len(allocs(traces[1])) == 1 and allocs(traces[0]) == []
    blocks = _blocks_of([s for s in snapshot["segments"] if s["device"] == 1], BLOCK)
    assert len(blocks) == 1 and blocks[0]["frames"]  # its allocating stack, recorded on device 1
    del on_one
