"""What torch on a CPU cannot provide is refused with one named error, UnsupportedOnEmulatedDevice
(a NotImplementedError), saying what and why: kernels compiled at run time and the raw CUDA graph
handles that cuda-bindings reads (PyTorch's own test_graph_external_wait_and_record_* and
test_cuda_graph_raw_graph* need them). Conditional graph nodes are emulated since branch tc6
(test_conditional_nodes.py)."""

from __future__ import annotations

import pytest
import torch

from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice


def test_compiling_a_kernel_at_run_time_is_refused_by_name(cuda_device):
    if not hasattr(torch.cuda, "_compile_kernel"):
        pytest.skip(f"torch {torch.__version__} has no torch.cuda._compile_kernel")
    with pytest.raises(UnsupportedOnEmulatedDevice, match=r"_compile_kernel\(\).*NVRTC.*driver"):
        torch.cuda._compile_kernel('extern "C" __global__ void k() {}', "k")


def test_the_raw_cuda_graph_handles_are_refused_by_name(cuda_device):
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    x = torch.zeros(4, device="cuda")
    with torch.cuda.graph(graph):
        x.add_(1)
    with pytest.raises(UnsupportedOnEmulatedDevice, match=r"raw_cuda_graph\(\).*no cudaGraph_t"):
        graph.raw_cuda_graph()
    graph.instantiate()
    with pytest.raises(UnsupportedOnEmulatedDevice, match=r"raw_cuda_graph_exec\(\)"):
        graph.raw_cuda_graph_exec()
