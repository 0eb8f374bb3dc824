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


_aten = torch.ops.aten


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("call", ["packet", "default", "out"])
def test_avg_pool3d_called_as_its_aten_op(cuda_kind, dtype, call):
    """Compiled code and decompositions call the aten op itself, not F.avg_pool3d."""
    torch.manual_seed(0)
    x = torch.randn(1, 2, 4, 4, 4, device="cuda").to(dtype)
    if call == "packet":
        out = _aten.avg_pool3d(x, [2, 2, 2])
    elif call == "default":
        out = _aten.avg_pool3d.default(x, [2, 2, 2])
    else:
        given = torch.empty(0, device="cuda", dtype=dtype)
        out = _aten.avg_pool3d.out(x, [2, 2, 2], out=given)
        assert out is given  # the out= tensor, resized and written
    assert (out.dtype, out.shape, out.is_cuda) == (dtype, (1, 2, 2, 2, 2), True)
    _close(out, F.avg_pool3d(x.float(), 2))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_backward_kernels_called_as_aten_ops(cuda_kind, dtype):
    torch.manual_seed(0)
    x = torch.randn(1, 2, 4, 4, 4, device="cuda").to(dtype)
    grad = torch.ones(1, 2, 2, 2, 2, device="cuda", dtype=dtype)
    pooled = _aten.avg_pool3d_backward(grad, x, [2, 2, 2], [2, 2, 2], [0, 0, 0], False, True, None)
    assert pooled.dtype == dtype
    _close(pooled, torch.full_like(x, 1 / 8))
    image = torch.randn(1, 2, 8, 8, device="cuda").to(dtype)
    down = _aten._upsample_bilinear2d_aa(image, [4, 4], False)
    back = _aten._upsample_bilinear2d_aa_backward(torch.ones_like(down), [4, 4], [1, 2, 8, 8],
                                                  False)
    assert (down.dtype, back.dtype, back.shape) == (dtype, dtype, image.shape)
    _close(down, F.interpolate(image.float(), size=(4, 4), mode="bilinear", antialias=True))
    scores = torch.randn(3, 5, device="cuda").to(dtype)
    target = torch.tensor([1, 0, 4], device="cuda")
    loss = _aten.multi_margin_loss(scores, target)
    assert _aten.multi_margin_loss_backward(torch.ones((), device="cuda", dtype=dtype), scores,
                                            target, 1, 1.0, None, 1).dtype == dtype
    _close(loss, F.multi_margin_loss(scores.float(), target))


def test_rrelu_in_place_writes_its_input_in_half(cuda_kind):
    """`rrelu_` and `F.rrelu(inplace=True)` write the tensor they are given, as CUDA's kernel
    does; computed on a widened copy, the copy's values go back into it."""
    torch.manual_seed(0)
    for rrelu in (lambda t: torch.rrelu_(t, training=True),
                  lambda t: F.rrelu(t, training=True, inplace=True),
                  lambda t: _aten.rrelu_(t, training=True)):
        x = torch.randn(64, device="cuda").half()
        before = x.clone()
        out = rrelu(x)
        assert out is x and out.dtype == torch.float16
        negative = before < 0
        slopes = x[negative].float() / before[negative].float()
        assert bool((slopes >= 1 / 8 - 1e-2).all() and (slopes <= 1 / 3 + 1e-2).all())
        assert torch.equal(x[~negative], before[~negative])


def test_rrelu_with_noise_writes_the_noise_it_is_given(cuda_kind):
    torch.manual_seed(0)
    x = -torch.rand(32, device="cuda").half() - 0.5
    noise = torch.zeros(32, device="cuda").half()
    out = _aten.rrelu_with_noise(x, noise, 0.125, 1 / 3, True)
    assert out.dtype == torch.float16
    assert bool((noise >= 1 / 8 - 1e-3).all() and (noise <= 1 / 3 + 1e-3).all())
    _close(out, x.float() * noise.float())


@pytest.mark.parametrize("mode", ["sync_debug", "deterministic"])
def test_a_half_pooling_under_the_debug_modes(cuda_kind, mode):
    """The sync debug mode and the deterministic mode run the call through their own runners;
    the kernel is the same one CUDA has there."""
    x = torch.randn(1, 2, 4, 4, 4, device="cuda").half()
    if mode == "sync_debug":
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = F.avg_pool3d(x, 2)
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    else:
        previous = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            out = F.avg_pool3d(x, 2)
        finally:
            torch.use_deterministic_algorithms(previous)
    assert out.dtype == torch.float16
    _close(out, F.avg_pool3d(x.float(), 2))


def test_a_captured_aten_pooling_replays_on_new_input(cuda_kind):
    static = torch.zeros(1, 2, 4, 4, 4, device="cuda").half()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _aten.avg_pool3d.default(static, [2, 2, 2])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _aten.avg_pool3d.default(static, [2, 2, 2])
    fresh = torch.randn(1, 2, 4, 4, 4, device="cuda").half()
    static.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    _close(out, F.avg_pool3d(fresh.float(), 2))


def test_a_compiled_half_pooling_runs_its_aten_op(cuda_kind):
    """aot_eager's graph calls `aten.avg_pool3d.default` itself, with the placement mode off the
    stack (compiled_graphs.py)."""
    torch._dynamo.reset()
    x = torch.randn(1, 2, 4, 4, 4, device="cuda").half()
    compiled = torch.compile(lambda t: F.avg_pool3d(t, 2) * 2, backend="aot_eager")
    out = compiled(x)
    assert (out.dtype, out.is_cuda) == (torch.float16, True)
    _close(out, F.avg_pool3d(x.float(), 2) * 2)
