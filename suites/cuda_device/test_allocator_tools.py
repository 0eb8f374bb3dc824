"""torch.cuda's allocator tooling on the emulated device, in CUDA's shapes: raw allocations,
memory history and snapshots, MemPool and use_mem_pool, graph-safe generator state, and statistics
that keep a peak reached before the first statistics call."""

from __future__ import annotations

import gc
import threading

import pytest
import torch
import torch.cuda.graphs

import harness
from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice

MiB = 1 << 20
HERE = "test_allocator_tools.py"


def test_a_peak_reached_before_the_first_statistics_call_is_kept(outside_emulation):
    with harness.emulate_cuda(device="cpu"):
        big = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
        del big
        small = torch.empty(100, dtype=torch.uint8, device="cuda")
        # The first question comes after the peak: CUDA's allocator counted from the start.
        assert torch.cuda.max_memory_allocated() == 30 * MiB
        assert torch.cuda.memory_allocated() == 512
        stats = torch.cuda.memory_stats()
        assert stats["allocation.all.allocated"] == 2 and stats["allocation.all.peak"] == 1
        assert stats["allocated_bytes.all.freed"] == 30 * MiB
        assert stats["requested_bytes.all.peak"] == 30 * MiB
        assert stats["allocated_bytes.large_pool.peak"] == 30 * MiB
        assert torch.cuda.max_memory_reserved() >= torch.cuda.max_memory_allocated()
        del small
        assert torch.cuda.memory_stats()["allocation.all.freed"] == 2


def test_counts_of_thousands_of_allocations_before_the_first_statistics_call_are_kept(
        outside_emulation):
    # Past the first few thousand allocations and frees the model starts from the storages alive
    # and the counts moved so far, which the device plays in batches: the last batch counts too.
    with harness.emulate_cuda(device="cpu"):
        kept = torch.empty(1000, dtype=torch.uint8, device="cuda")
        for _ in range(3000):
            torch.empty(100, dtype=torch.uint8, device="cuda")
        big = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
        del big
        for _ in range(7):
            torch.empty(600, dtype=torch.uint8, device="cuda")
        stats = torch.cuda.memory_stats()
        assert stats["allocation.all.allocated"] == 1 + 3000 + 1 + 7
        assert stats["allocation.all.freed"] == 3000 + 1 + 7
        assert stats["allocation.all.peak"] == 2
        assert stats["allocated_bytes.all.freed"] == 3000 * 512 + 30 * MiB + 7 * 1024
        assert stats["requested_bytes.all.peak"] == 1000 + 30 * MiB
        assert torch.cuda.memory_allocated() == 1024
        del kept


def test_segments_cached_from_frees_before_the_first_statistics_call_are_kept(outside_emulation):
    # PyTorch's test files make a device tensor at import; CUDA's allocator caches its segment.
    with harness.emulate_cuda(device="cpu"):
        big = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
        del big
        small = torch.empty(100, dtype=torch.uint8, device="cuda")
        del small
        assert torch.cuda.memory_allocated() == 0
        assert torch.cuda.memory_reserved() == 30 * MiB + 2 * MiB
        assert sorted(s["total_size"] for s in torch.cuda.memory_snapshot()) == [2 * MiB, 30 * MiB]
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() == 0


def test_a_negative_raw_allocation_is_a_value_error(cuda_device):
    # The raw_alloc binding's check, before any allocation (PyTorch's
    # test_caching_allocator_alloc_negative_size).
    with pytest.raises(ValueError, match="Invalid memory size"):
        torch.cuda.memory.caching_allocator_alloc(-1024)


def test_caching_allocator_alloc_and_delete(cuda_device):
    gc.collect()
    before = torch.cuda.memory_allocated()
    pointer = torch.cuda.caching_allocator_alloc(1)
    assert isinstance(pointer, int) and torch.cuda.memory_allocated() == before + 512
    torch.cuda.caching_allocator_delete(pointer)
    assert torch.cuda.memory_allocated() == before
    with pytest.raises(RuntimeError, match="^invalid device pointer"):
        torch.cuda.caching_allocator_delete(pointer)


def test_the_memory_history_and_snapshot_have_cuda_s_shapes(cuda_device):
    torch.cuda.memory._record_memory_history(max_entries=1000)
    try:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            kept = torch.empty(12 * MiB, dtype=torch.uint8, device="cuda")  # its own segment
            dropped = torch.empty(1000, device="cuda")
            del dropped
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    assert {"segments", "device_traces"} <= snapshot.keys()
    segment = next(s for s in snapshot["segments"]
                   if any(b["size"] == 12 * MiB and b["state"] == "active_allocated"
                          for b in s["blocks"]))
    assert segment["total_size"] == 12 * MiB and segment["segment_type"] == "large"
    assert segment["segment_pool_id"] == (0, 0) and segment["stream"] == stream.cuda_stream
    assert segment["allocated_size"] == 12 * MiB
    block = segment["blocks"][0]
    assert block["requested_size"] == 12 * MiB
    assert block["frames"][0]["filename"].endswith(HERE)  # the allocating line, innermost first
    trace = snapshot["device_traces"][0]
    actions = [(e["action"], e["size"]) for e in trace]
    assert ("segment_alloc", 12 * MiB) in actions and ("alloc", 12 * MiB) in actions
    assert [a for a, size in actions if size == 4096][-3:] == [
        "alloc", "free_requested", "free_completed"]
    assert all({"action", "addr", "size", "stream", "frames"} <= e.keys() for e in trace)
    segments = torch.cuda.memory_snapshot()
    assert any(s["address"] == segment["address"] for s in segments)
    del kept


def test_a_mem_pool_takes_this_thread_s_allocations_and_reuses_its_blocks(cuda_device):
    pool = torch.cuda.MemPool()
    assert pool.id[0] == 0 and pool.id[1] >= 1 and pool.use_count() == 1
    before = torch.cuda.memory_allocated()
    in_other_thread = []
    with torch.cuda.use_mem_pool(pool):
        assert pool.use_count() == 2
        first = torch.empty(MiB // 4, device="cuda")  # 1 MiB: a large-pool block
        address = [b["address"] for s in pool.snapshot() for b in s["blocks"]
                   if b["state"] == "active_allocated"]
        del first
        second = torch.empty(MiB // 4, device="cuda")
        thread = threading.Thread(target=_allocate_into, args=(in_other_thread,))
        thread.start()
        thread.join()
    assert pool.use_count() == 1
    # Counted as any allocation (the other thread's tensor is device memory where threads are
    # emulated, and then it must come from the regular pool).
    threads_on_device = isinstance(in_other_thread[0], torch.Tensor) and in_other_thread[0].is_cuda
    assert torch.cuda.memory_allocated() == before + MiB * (2 if threads_on_device else 1)
    segments = pool.snapshot()
    assert len(segments) == 1 and segments[0]["segment_pool_id"] == pool.id
    active = [b["address"] for b in segments[0]["blocks"] if b["state"] == "active_allocated"]
    assert active == address  # the freed block was taken again, and only this thread's
    outside = torch.empty(MiB // 4, device="cuda")
    assert len(pool.snapshot()[0]["blocks"]) == len(segments[0]["blocks"])
    del second, outside, in_other_thread


def _allocate_into(out: list) -> None:
    try:
        out.append(torch.empty(MiB // 4, device="cuda"))
    except Exception as error:  # a thread the emulation does not reach: no device there
        out.append(error)


def test_a_dropped_mem_pool_gives_its_segments_back_on_empty_cache(cuda_device):
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        x = torch.empty(MiB, device="cuda")
    pool_id = pool.id
    del x
    gc.collect()
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved()
    assert any(s["segment_pool_id"] == pool_id for s in torch.cuda.memory_snapshot())
    del pool
    gc.collect()
    torch.cuda.empty_cache()
    assert not any(s["segment_pool_id"] == pool_id for s in torch.cuda.memory_snapshot())
    assert torch.cuda.memory_reserved() < reserved


# The build's version, not hasattr(torch.cuda.graphs.CUDAGraph, ...): under a session-wide
# --emulate-cuda that name is the emulated class already at collection.
@pytest.mark.skipif(torch.torch_version.TorchVersion(torch.__version__) < (2, 14),
                    reason="this torch's graphs do not retain a MemPool used in capture (< 2.14)")
def test_a_mem_pool_used_inside_a_capture_is_held_by_the_graph_until_its_reset(cuda_kind):
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer's pools are CUDA's allocator's: it refuses _retain_pool")
    side = torch.cuda.MemPool()
    x = torch.ones(4, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x + 1
        with torch.cuda.use_mem_pool(side):
            tmp = y * 2
        z = tmp + 1
    assert set(g.pools()) == {tuple(g.pool()), side.id}
    assert side.use_count() == 2  # the MemPool's and the graph's
    side_id = side.id
    del side, tmp
    gc.collect()
    torch.cuda.empty_cache()
    assert any(s["segment_pool_id"] == side_id for s in torch.cuda.memory_snapshot())
    x.fill_(2)
    g.replay()
    torch.cuda.synchronize()
    assert z.eq(7).all()
    g.reset()
    assert g.pools() == []
    gc.collect()
    torch.cuda.empty_cache()
    assert not any(s["segment_pool_id"] == side_id for s in torch.cuda.memory_snapshot())


def test_use_mem_pool_of_none_raises_cudas_attribute_error(cuda_kind):
    # torch's use_mem_pool reads `pool.id` first (measured on an H200, torch 2.11); the emulated
    # device raised a TypeError of its own
    with pytest.raises(AttributeError, match="^'NoneType' object has no attribute 'id'"):
        with torch.cuda.use_mem_pool(None):
            pass


def test_a_mem_pool_with_a_custom_allocator_is_refused_by_name(cuda_device):
    with pytest.raises(UnsupportedOnEmulatedDevice, match=r"MemPool\(allocator=.*needs a GPU"):
        torch.cuda.MemPool(allocator=object())


def test_graph_safe_state_of_a_device_generator(cuda_device):
    generator = torch.Generator(device="cuda")
    generator.manual_seed(3)
    saved = generator.clone_state()  # a copy: graphsafe_get_state() would share the state
    drawn = torch.rand(4, generator=generator, device="cuda")
    generator.graphsafe_set_state(saved)
    assert torch.equal(torch.rand(4, generator=generator, device="cuda"), drawn)
    with pytest.raises(RuntimeError, match="graphsafe_set_state takes a generator of the device"):
        generator.graphsafe_set_state(torch.Generator())


def test_the_allocator_backend_is_cuda_s_native_one(cuda_device):
    # PyTorch's own tests read it at import to pick their expectations (TEST_CUDAMALLOCASYNC).
    assert torch.cuda.get_allocator_backend() == "native"
    assert torch.cuda.memory.get_allocator_backend() == "native"


def test_the_memory_fraction_reads_back_what_was_set(cuda_device):
    assert torch.cuda.get_per_process_memory_fraction() == 1.0
    torch.cuda.set_per_process_memory_fraction(0.25)
    try:
        assert torch.cuda.get_per_process_memory_fraction(0) == 0.25
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


def test_a_switched_off_caching_allocator_gives_each_freed_segment_back(cuda_device):
    """caching_allocator_enable(False): a freed tensor's segment goes back to the device at once
    (reserved falls with allocated), where the caching allocator keeps it until empty_cache."""
    torch.cuda.empty_cache()
    assert torch._C._cuda_cudaCachingAllocator_is_enabled()
    x = torch.empty(4 * MiB, device="cuda")
    del x
    gc.collect()
    cached = torch.cuda.memory_reserved()
    torch.cuda.memory.caching_allocator_enable(False)
    try:
        assert not torch._C._cuda_cudaCachingAllocator_is_enabled()
        y = torch.empty(8 * MiB, device="cuda")
        with_y = torch.cuda.memory_reserved()
        del y
        gc.collect()
        assert torch.cuda.memory_reserved() <= with_y - 8 * MiB * 4
    finally:
        torch.cuda.memory.caching_allocator_enable(True)
    z = torch.empty(8 * MiB, device="cuda")
    with_z = torch.cuda.memory_reserved()
    del z
    gc.collect()
    assert torch.cuda.memory_reserved() == with_z, "caching is back on: the segment stays"
    assert cached > 0


def test_the_nested_statistics_flatten_to_memory_stats(cuda_device):
    x = torch.empty(MiB, device="cuda")
    nested = torch.cuda.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] >= MiB
    flat = {}

    def walk(prefix, node):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else key
            walk(path, value) if isinstance(value, dict) else flat.__setitem__(path, value)

    walk("", nested)
    assert flat == dict(torch.cuda.memory_stats())
    del x


def test_allocator_settings_the_model_does_not_act_on_are_reported_once(cuda_device):
    """expandable_segments and friends change CUDA's segments, so its statistics: the emulated
    allocator model follows the defaults, and says so once per key instead of in silence."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            torch.cuda.memory._set_allocator_settings(
                "expandable_segments:False,graph_capture_record_stream_reuse:False")
    reports = [str(w.message) for w in caught if "allocator model" in str(w.message)]
    if "expandable_segments" in cuda_device.unmodelled_allocator_settings and not reports:
        pytest.skip("this session's emulation reported the key before this test")
    assert len(reports) == 1 and "'expandable_segments'" in reports[0]
