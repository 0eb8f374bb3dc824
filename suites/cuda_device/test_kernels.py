"""Kernels CUDA has and the CPU build lacks answer on the emulated device as on CUDA: an integer
`histc` (transformers' grouped MoE counts tokens per expert with it on cuda) and `mm` with
`out_dtype` (a router's float32 logits); host tensors keep the cpu's answer, errors included."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_histc_counts_in_the_input_dtype_on_the_device(cuda_device, dtype):
    ids = torch.tensor([0, 1, 1, 3, 3, 3, 7], dtype=dtype, device="cuda")
    counts = torch.histc(ids, bins=4, min=0, max=3)
    assert counts.is_cuda and counts.dtype == dtype
    assert counts.cpu().tolist() == [1, 2, 0, 3]  # 7 is past max: not counted, as on CUDA
    assert ids.histc(bins=2, min=0, max=3).cpu().tolist() == [3, 3]


def test_integer_histc_captures_and_replays_the_live_input(cuda_device):
    ids = torch.zeros(6, dtype=torch.int32, device="cuda")
    torch.histc(ids, bins=4, min=0, max=3)  # warmup, as code written for CUDA does
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        counts = torch.histc(ids, bins=4, min=0, max=3)
    ids.copy_(torch.tensor([3, 3, 2, 1, 0, 3], dtype=torch.int32))
    graph.replay()
    assert counts.cpu().tolist() == [1, 1, 1, 3]


def test_a_host_integer_histc_keeps_the_cpu_error(cuda_device):
    with pytest.raises(RuntimeError, match="histogram_cpu"):
        torch.histc(torch.tensor([1, 2], dtype=torch.int32), bins=2, min=0, max=2)


def test_mm_with_out_dtype_multiplies_in_float32(cuda_device):
    a = torch.tensor([[1.0, 2.0], [3.0, 0.5]], dtype=torch.bfloat16, device="cuda")
    b = torch.tensor([[0.25, 1.0], [1.0, -2.0]], dtype=torch.bfloat16, device="cuda")
    logits = torch.mm(a, b, out_dtype=torch.float32)
    assert logits.is_cuda and logits.dtype == torch.float32
    assert logits.cpu().tolist() == [[2.25, -3.0], [1.25, 2.0]]
    assert torch.mm(a, b).dtype == torch.bfloat16
