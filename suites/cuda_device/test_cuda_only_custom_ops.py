"""Custom ops whose only kernel is a Python CUDA one (vLLM registers its ops so): on the emulated
device a device call runs that kernel, where before it failed with "Could not run ... with
arguments from the 'CPU' backend"; a capture records the op and each replay runs it; the routing
ends with the emulation."""

from __future__ import annotations

import itertools

import pytest
import torch

import harness
from harness.emulation import emulation_active

_NAMES = itertools.count()


def _cuda_only_op():
    """A fresh op `harness_test_cuda_only::scale_N(Tensor x, float s) -> Tensor`, CUDA only."""
    name = f"harness_test_cuda_only::scale_{next(_NAMES)}"

    @torch.library.custom_op(name, mutates_args=(), device_types="cuda")
    def scale(x: torch.Tensor, s: float) -> torch.Tensor:
        return x * s

    scale.register_fake(lambda x, s: torch.empty_like(x))
    return scale


def test_a_cuda_only_custom_op_runs_its_cuda_kernel(cuda_device):
    scale = _cuda_only_op()
    out = scale(torch.ones(3, device="cuda"), 3.0)
    assert out.is_cuda and out.tolist() == [3.0] * 3


def test_a_kernel_registered_with_library_impl_for_cuda_runs(cuda_device):
    name = f"harness_test_cuda_only_lib{next(_NAMES)}"
    library = torch.library.Library(name, "DEF")
    try:
        library.define("twice(Tensor x) -> Tensor")
        library.impl("twice", lambda x: x * 2, "CUDA")
        op = getattr(torch.ops, name).twice
        assert op(torch.full((2,), 4.0, device="cuda")).tolist() == [8.0, 8.0]
    finally:
        library._destroy()


def test_a_capture_records_the_op_and_each_replay_runs_it(cuda_device):
    scale = _cuda_only_op()
    x = torch.ones(3, device="cuda")
    scale(x, 2.0)  # warm up
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = scale(x, 2.0)
    torch.cuda.current_stream().wait_stream(stream)
    x.fill_(5.0)
    graph.replay()
    torch.cuda.synchronize()
    assert out.tolist() == [10.0] * 3


def test_the_routing_ends_with_the_emulation(outside_emulation):
    scale = _cuda_only_op()
    with harness.emulate_cuda(device="cpu"):
        assert scale(torch.ones(2, device="cuda"), 2.0).tolist() == [2.0, 2.0]
    assert emulation_active() is None
    with pytest.raises(NotImplementedError, match="Could not run"):
        scale(torch.ones(2), 2.0)
