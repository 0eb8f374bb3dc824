"""torch 2.14's autograd engine refuses stream syncs across a CUDA graph capture boundary: a
gradient from a capture reaching a leaf (AccumulateGrad) that a warmup made on the default stream,
and at the end of backward() a leaf's stream and the caller's, one capturing and the other not.
`torch.autograd.graph.set_override_stale_capture_stream(True)` redirects the first and skips the
second. The rows run on builds with that function (2.14 and later); the graph sanitizer does not
model the checks (it runs the engine on real streams that no real capture holds)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not hasattr(torch.autograd.graph, "set_override_stale_capture_stream"),
    reason="this torch's autograd engine makes no stream checks across a capture (< 2.14)")


@pytest.fixture
def where(cuda_kind):
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer does not model autograd's stale-stream checks")
    yield cuda_kind
    torch.autograd.graph.set_override_stale_capture_stream(False)


class _CpuComputeCudaWeight(torch.autograd.Function):
    """Host compute naming a device weight: its leaf is made where apply() runs, its gradient is
    undefined, and the host nodes make no stream sync of their own."""

    @staticmethod
    def forward(ctx, x_cpu, w_cuda):
        return x_cpu * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2, None


class _NoWeightGrad(torch.autograd.Function):
    """Uses the weight and returns no gradient for it."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(w)
        return x @ w.t()

    @staticmethod
    def backward(ctx, grad):
        (w,) = ctx.saved_tensors
        return grad @ w, None


def _warmed_on_the_default_stream(keep_graph: bool):
    """A Linear run forward and backward on the default stream; with `keep_graph` its loss is
    returned too, holding the leaves' AccumulateGrad nodes (made on the default stream)."""
    with torch.cuda.stream(torch.cuda.default_stream()):
        model = torch.nn.Linear(8, 8).cuda()
        x = torch.ones(2, 8, device="cuda")
        warm = model(x).sum()
        warm.backward(retain_graph=keep_graph)
    torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    return model, x, (warm if keep_graph else None)


def _capture_backward_of(model, x):
    """Capture model(x).sum().backward() on a side stream: (the graph, the error it raised)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    error = None
    with torch.cuda.stream(s):
        g.capture_begin(capture_error_mode="relaxed")
        try:
            model(x).sum().backward()
        except RuntimeError as e:
            error = e
        finally:
            g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    return g, error


def test_a_default_stream_leaf_kept_from_warmup_is_refused_in_capture(where):
    model, x, kept = _warmed_on_the_default_stream(keep_graph=True)
    _, error = _capture_backward_of(model, x)
    assert error is not None
    assert ("During CUDA graph capture, autograd node 'torch::autograd::AccumulateGrad' has a stale "
            "reference to the default stream (stream 0) from warmup.") in str(error)


def test_a_default_stream_warmup_whose_graph_is_gone_captures(where):
    model, x, _ = _warmed_on_the_default_stream(keep_graph=False)
    g, error = _capture_backward_of(model, x)
    assert error is None
    g.replay()
    torch.cuda.synchronize()
    assert model.bias.grad.eq(2).all()


def test_the_override_gives_a_stale_leaf_the_capturing_stream(where):
    model, x, kept = _warmed_on_the_default_stream(keep_graph=True)
    torch.autograd.graph.set_override_stale_capture_stream(True)
    g, error = _capture_backward_of(model, x)
    assert error is None
    g.replay()
    torch.cuda.synchronize()
    assert model.bias.grad.eq(2).all()


def test_a_stale_leaf_without_a_gradient_is_refused_at_the_end_of_backward(where):
    w = torch.nn.Parameter(torch.randn(4, 4, device="cuda"))
    x = torch.randn(2, 4, device="cuda")
    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        kept = _NoWeightGrad.apply(x, w)  # w's AccumulateGrad, made on `warmup`
        kept.sum().backward(retain_graph=True)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        g.capture_begin(capture_error_mode="relaxed")
        try:
            with pytest.raises(RuntimeError) as raised:
                _NoWeightGrad.apply(x, w).sum().backward()
        finally:
            g.capture_end()
    torch.cuda.synchronize()
    assert (f"across the capture boundary (leaf stream {warmup.stream_id} on device 0 is not "
            f"capturing but the caller's stream is)") in str(raised.value)


def _capture_with_a_leaf_made_inside():
    w = torch.nn.Parameter(torch.randn(8, device="cuda"))
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        g.capture_begin(capture_error_mode="relaxed")
        torch.ones(4, device="cuda").mul_(2)  # not an empty capture
        loss = _CpuComputeCudaWeight.apply(torch.randn(8), w).sum()
    return g, s, loss


def test_backward_outside_a_capture_of_a_leaf_made_inside_it_is_refused(where):
    g, s, loss = _capture_with_a_leaf_made_inside()
    try:
        with pytest.raises(RuntimeError) as raised:
            loss.backward()
    finally:
        with torch.cuda.stream(s):
            g.capture_end()
    torch.cuda.synchronize()
    assert (f"across the capture boundary (leaf stream {s.stream_id} on device 0 is capturing but "
            f"the caller's stream is not)") in str(raised.value)


def test_the_override_skips_the_end_of_backward_sync(where):
    torch.autograd.graph.set_override_stale_capture_stream(True)
    g, s, loss = _capture_with_a_leaf_made_inside()
    loss.backward()
    with torch.cuda.stream(s):
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    torch.cuda.synchronize()
