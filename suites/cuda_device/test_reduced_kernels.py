"""Half and bfloat16 kernels CUDA has and the CPU build lacks: the emulated device computes them
(harness/emulation/reduced_kernels.py) in the input's dtype, close to the float32 answer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


def _close(out, reference):
    torch.testing.assert_close(out.float(), reference.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_avg_pool3d_in_a_reduced_dtype_runs_forward_and_backward(cuda_kind, dtype):
    torch.manual_seed(0)
    x = torch.randn(1, 2, 4, 4, 4, device="cuda")
    reduced = x.to(dtype).requires_grad_()
    out = F.avg_pool3d(reduced, 2)
    out.sum().backward()
    assert (out.dtype, reduced.grad.dtype) == (dtype, dtype) and out.is_cuda
    _close(out, F.avg_pool3d(x.to(dtype).float(), 2))
    _close(reduced.grad, torch.full_like(x, 1 / 8))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_margin_losses_in_a_reduced_dtype(cuda_kind, dtype):
    torch.manual_seed(0)
    scores = torch.randn(3, 5, device="cuda")
    target = torch.tensor([1, 0, 4], device="cuda")
    labels = torch.tensor([[1, 3, -1, 0, 0], [0, -1, 0, 0, 0], [4, 2, 1, -1, 0]], device="cuda")
    multi = F.multi_margin_loss(scores.to(dtype), target)
    multilabel = F.multilabel_margin_loss(scores.to(dtype), labels)
    assert (multi.dtype, multilabel.dtype) == (dtype, dtype)
    _close(multi, F.multi_margin_loss(scores.to(dtype).float(), target))
    _close(multilabel, F.multilabel_margin_loss(scores.to(dtype).float(), labels))


def test_rrelu_in_half_while_training(cuda_kind):
    x = torch.randn(64, device="cuda").half()
    out = F.rrelu(x, training=True)
    assert out.dtype == torch.float16 and out.is_cuda
    negative = x < 0
    slopes = out[negative].float() / x[negative].float()
    assert bool((slopes >= 1 / 8 - 1e-2).all() and (slopes <= 1 / 3 + 1e-2).all())
    assert torch.equal(out[~negative], x[~negative])


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_antialiased_interpolation_in_half(cuda_kind, mode):
    torch.manual_seed(0)
    image = torch.randn(1, 2, 8, 8, device="cuda")
    out = F.interpolate(image.half(), size=(4, 4), mode=mode, antialias=True)
    assert out.dtype == torch.float16 and out.is_cuda
    _close(out, F.interpolate(image.half().float(), size=(4, 4), mode=mode, antialias=True))


def test_a_captured_half_pooling_replays_on_new_input(cuda_kind):
    static = torch.zeros(1, 2, 4, 4, 4, device="cuda").half()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        F.avg_pool3d(static, 2)  # warm-up outside the capture, as CUDA's allocator wants
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = F.avg_pool3d(static, 2)
    fresh = torch.randn(1, 2, 4, 4, 4, device="cuda").half()
    static.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    _close(out, F.avg_pool3d(fresh.float(), 2))
