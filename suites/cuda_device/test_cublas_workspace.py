"""cuBLAS workspaces as PyTorch keeps them on CUDA: one per (handle, stream), taken from the caching
allocator at the first BLAS call on a stream and held for the process's life, in a graph's private
pool when that first call is captured. PyTorch's test_cuda_graph_allocator_propagates_stream
counts on the regular pool holding such a segment.

On a GPU the same checks run against CUDA (not under the graph sanitizer, whose graph pools are
the emulator's arena), in a session of this file alone: each test takes streams CUDA has not used
for a matmul yet, which holds while fewer than 32 streams of a priority were made."""

from __future__ import annotations

import contextlib
import gc
import warnings

import pytest
import torch

import harness
from harness.emulation import emulation_active
from harness.emulation.blas_workspaces import HOPPER_BYTES, OTHER_BYTES, workspace_bytes


@pytest.fixture(autouse=True)
def device(request):
    with contextlib.ExitStack() as stack:
        if emulation_active() == "cuda":
            pytest.skip("the graph sanitizer: graph pools are the emulator's arena, not CUDA's")
        # Workspaces live as long as the process (or the session's emulation): other files' streams
        # and matmuls would already hold the ones these tests count.
        if (emulation_active() is not None or torch.cuda.is_available()) and any(
                item.path != request.node.path for item in request.session.items):
            pytest.skip("workspaces are counted only in a session of this file alone, or in an "
                        "emulation of their own")
        if emulation_active() is None and not torch.cuda.is_available():
            stack.enter_context(harness.emulate_cuda(device="cpu"))
        gc.collect()
        torch.cuda.empty_cache()
        yield


def expected_workspace() -> int:
    return workspace_bytes(torch.cuda.get_device_capability()[0], None)


def matmul(a: torch.Tensor) -> None:
    """A matmul whose product is dropped at once."""
    a @ a


def allocated() -> int:
    gc.collect()
    return torch.cuda.memory_allocated()


def test_the_first_matmul_on_a_stream_keeps_a_workspace_allocated():
    with torch.cuda.stream(torch.cuda.Stream()):
        a = torch.ones(8, 8, device="cuda")
        before = allocated()
        matmul(a)
        after_first = allocated()
        matmul(a)
        assert after_first - before == expected_workspace()
        assert allocated() == after_first  # one per stream: the second matmul takes none


def test_each_stream_gets_its_own_workspace():
    a = torch.ones(8, 8, device="cuda")
    before = allocated()
    for _ in range(2):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            torch.nn.functional.linear(a, a)
        torch.cuda.current_stream().wait_stream(stream)
    assert allocated() - before == 2 * expected_workspace()


def test_the_workspace_is_a_regular_pool_segment_that_empty_cache_keeps():
    with torch.cuda.stream(torch.cuda.Stream()):
        a = torch.ones(8, 8, device="cuda")
        matmul(a)
    torch.cuda.empty_cache()
    sizes = [s["total_size"] for s in torch.cuda.memory_snapshot()
             if s["segment_pool_id"] == (0, 0) and s["allocated_size"] == expected_workspace()]
    assert sizes, "no regular-pool segment holds the workspace"


def test_a_first_matmul_inside_a_capture_takes_its_workspace_from_the_graph_pool():
    a = torch.ones(8, 8, device="cuda")
    # The thread's handle exists (a matmul on another stream): creating it inside the capture
    # would be refused (test_cublas_handles.py); its workspace for the capture stream is new.
    matmul(a)
    g = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        g.capture_begin()
        out = a @ a
        g.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    in_graph_pool = sum(s["allocated_size"] for s in torch.cuda.memory_snapshot()
                        if s["segment_pool_id"] == g.pool())
    assert in_graph_pool >= expected_workspace() + out.numel() * out.element_size()


def test_clearing_the_workspaces_gives_their_memory_back():
    with torch.cuda.stream(torch.cuda.Stream()):
        a = torch.ones(8, 8, device="cuda")
        before = allocated()
        matmul(a)
        torch._C._cuda_clearCublasWorkspaces()
        assert allocated() == before
        matmul(a)  # made again at the next matmul
        assert allocated() - before == expected_workspace()


def test_backward_matmuls_use_the_autograd_engines_handle():
    # The engine runs a device's backward in a thread of its own: another handle, another workspace.
    with torch.cuda.stream(torch.cuda.Stream()):
        w = torch.ones(8, 8, device="cuda", requires_grad=True)
        x = torch.ones(8, 8, device="cuda")
        before = allocated()
        (x @ w).sum().backward()
        w.grad = None
        assert allocated() - before == 2 * expected_workspace()
    torch._C._cuda_clearCublasWorkspaces()
    assert allocated() == before


def test_the_size_follows_cublas_workspace_config():
    assert workspace_bytes(9, None) == HOPPER_BYTES == 32 << 20
    assert workspace_bytes(8, None) == OTHER_BYTES == 4096 * 1024 * 2 + 16 * 1024 * 8
    assert workspace_bytes(8, ":4096:8") == 32 << 20
    assert workspace_bytes(9, ":16:8:4096:2") == 16 * 1024 * 8 + 4096 * 1024 * 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert workspace_bytes(9, "nonsense") == HOPPER_BYTES
    assert "Could not parse CUBLAS_WORKSPACE_CONFIG" in str(caught[0].message)


def test_pytorchs_graph_pool_segments_are_the_only_new_pool_ids():
    # test_cuda_graph_allocator_propagates_stream's count, after a matmul (as on CUDA, where the
    # regular pool already holds its workspace when the test starts).
    torch._C._cuda_clearCublasWorkspaces()
    with torch.cuda.stream(torch.cuda.Stream()):
        matmul(torch.ones(8, 8, device="cuda"))
    torch.cuda.empty_cache()  # what stays is the workspace
    existing = {s["segment_pool_id"] for s in torch.cuda.memory_snapshot()}
    x = torch.randn(10240000, device="cuda")
    y = torch.rand_like(x)
    g = torch.cuda.CUDAGraph()
    s0, s1 = torch.cuda.Stream(), torch.cuda.Stream()
    s0.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s0):
        g.capture_begin()
        z = x + y
    with torch.cuda.stream(s1):
        s1.wait_stream(s0)
        z + y
    s0.wait_stream(s1)
    with torch.cuda.stream(s0):
        g.capture_end()
    new = [s["segment_pool_id"] for s in torch.cuda.memory_snapshot()
           if s["segment_pool_id"] not in existing]
    assert new == [g.pool(), g.pool()]


def test_current_blas_handle_reserves_the_handle_and_its_workspace_as_a_first_matmul():
    # at::cuda::getCurrentCUDABlasHandle sets the handle's workspace on the current stream: a
    # runtime asking for the handle (to hand a library) allocates what its first matmul would.
    with torch.cuda.stream(torch.cuda.Stream()):
        a = torch.ones(8, 8, device="cuda")
        before = allocated()
        handle = torch.cuda.current_blas_handle()
        assert handle != 0
        assert allocated() - before == expected_workspace()
        assert torch.cuda.current_blas_handle() == handle
        matmul(a)  # the same (handle, stream): no second workspace
        assert allocated() - before == expected_workspace()
