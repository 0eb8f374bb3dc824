"""What torch on a CPU cannot provide is refused with one named error, UnsupportedOnEmulatedDevice
(a NotImplementedError), saying what and why: kernels compiled at run time and the raw CUDA graph
handles that cuda-bindings reads (PyTorch's own test_graph_external_wait_and_record_* and
test_cuda_graph_raw_graph* need them)."""

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


def test_conditional_graph_nodes_are_refused_by_name(cuda_device):
    # PyTorch's test_cuda_graph_many_if_nodes_*: CUDA 12.4's if/while nodes decide on the GPU.
    pred = torch.zeros((), device="cuda", dtype=torch.bool)
    x = torch.zeros((), device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(UnsupportedOnEmulatedDevice, match=r"begin_capture_to_if_node\(\).*conditional"):
        with torch.cuda.graph(graph):
            graph.begin_capture_to_if_node(pred)
            x.add_(1.0)
            graph.end_capture_to_conditional_node()
