"""Under the graph sanitizer a graph's pool is a private pool of CUDA's caching allocator, as a real
capture's is: the capture's blocks sit in segments of that pool, the pool's memory is reserved
until its graphs are gone and the cache is emptied, and a block freed inside the capture after
use on another stream is not handed out again during it. A kernel launched through the driver
(torch.cuda._compile_kernel) cannot be recorded there and is refused by name inside a capture."""

from __future__ import annotations

import contextlib
import gc

import pytest
import torch

import harness
from harness.emulation import emulation_active
from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice

pytestmark = pytest.mark.gpu


@pytest.fixture
def sanitizer():
    if not torch.cuda.is_available():
        pytest.skip("the graph sanitizer runs on a real GPU")
    if emulation_active() == "cpu":
        pytest.skip("the session runs the emulated device, not the sanitizer")
    with contextlib.nullcontext() if emulation_active() == "cuda" else harness.emulate_cuda():
        gc.collect()
        torch.cuda.empty_cache()
        yield


def pools_of(address: int) -> list[tuple[int, int]]:
    return [tuple(s["segment_pool_id"]) for s in torch.cuda.memory_snapshot()
            if s["address"] <= address < s["address"] + s["total_size"]]


def test_a_captured_block_lives_in_the_graph_s_private_pool(sanitizer):
    stream = torch.cuda.Stream()
    x = torch.ones(1000, device="cuda")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        out = x * 2
    assert pools_of(out.data_ptr()) == [g.pool()]
    assert pools_of(x.data_ptr()) == [(0, 0)]  # made outside the capture: the regular pools


def test_an_unused_pool_s_segment_goes_back_at_empty_cache(sanitizer):
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        # made on the capture stream, so the default generator's two blocks (made there at the
        # capture's start, in the regular pools) fit in its segment
        x = torch.ones(1000, device="cuda")
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        out = x * 2
    g.replay()
    torch.cuda.synchronize()
    assert torch.cuda.memory_reserved() - reserved == 2 << 20  # one small-pool segment
    assert out.sum().item() == 2000
    del g, out
    gc.collect()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == reserved


def test_a_block_freed_in_capture_after_record_stream_is_not_reused_there(sanitizer):
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.stream(s1):
        g.capture_begin()
        data1 = torch.empty(8, device="cuda")
        first = data1.data_ptr()
        s2.wait_stream(s1)
        with torch.cuda.stream(s2):
            buf = data1 + 2
            data1.record_stream(s2)
        del data1
        data2 = torch.empty(8, device="cuda")
        s1.wait_stream(s2)
        g.capture_end()
    assert data2.data_ptr() != first
    del buf


def test_a_driver_launched_kernel_inside_a_capture_is_refused_by_name(sanitizer):
    compile_kernel = getattr(torch.cuda, "_compile_kernel", None)
    if compile_kernel is None:
        pytest.skip(f"torch {torch.__version__} has no torch.cuda._compile_kernel")
    kernel = compile_kernel("__global__ void add_one(float *x) { x[threadIdx.x] += 1.0f; }",
                            "add_one")
    x = torch.zeros(4, device="cuda")
    kernel(grid=(1, 1, 1), block=(4, 1, 1), args=[x])  # outside a capture it runs
    torch.cuda.synchronize()
    assert x.tolist() == [1.0] * 4
    g = torch.cuda.CUDAGraph()
    with pytest.raises(UnsupportedOnEmulatedDevice, match=r"_compile_kernel\(\) launched during"):
        with torch.cuda.graph(g):
            kernel(grid=(1, 1, 1), block=(4, 1, 1), args=[x])


def _real_capture_after_sanitizer_graphs() -> list[float]:
    """In a fresh process: three sanitizer graphs captured into pools of their own, reset with
    their outputs kept (so the allocator keeps the released pools), then a real CUDA graph."""
    x = torch.ones(4, device="cuda")
    kept = []
    with harness.emulate_cuda():
        for _ in range(3):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                kept.append(x * 2)
            graph.reset()
    real = torch.cuda.CUDAGraph()
    with torch.cuda.graph(real):
        y = x * 3
    real.replay()
    torch.cuda.synchronize()
    return y.tolist()


def test_a_real_graph_captured_after_sanitizer_graphs_gets_a_pool_of_its_own():
    # A sanitizer graph's own pool once took the ids (1, 0), (2, 0), ... that CUDA gives real
    # graphs captured later in the process, whose capture_begin then failed on the allocator's
    # internal assert `use_count > 0`.
    from suites.cuda_device._own_process import in_a_process_of_its_own

    if not torch.cuda.is_available() or emulation_active() is not None:
        pytest.skip("a real GPU outside any emulation")
    assert in_a_process_of_its_own(__file__, "_real_capture_after_sanitizer_graphs") == [3.0] * 4
