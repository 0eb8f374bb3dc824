"""`torch.autocast("cuda")` on the emulated CUDA device casts as CUDA's autocast does, its weight
cast cache included (the cache a public capture bug relies on)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.graphs.base import FreedMemoryError


def test_matmuls_run_in_the_autocast_dtype_and_softmax_in_float32(cuda_device):
    x = torch.randn(4, 8, device="cuda")
    layer = torch.nn.Linear(8, 8).cuda()
    with torch.autocast("cuda"):
        assert torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.float16
        hidden = layer(x)
        assert hidden.dtype == (x @ x.T).dtype == torch.mm(x, x.T).dtype == torch.float16
        assert hidden.is_cuda
        assert F.softmax(hidden, -1).dtype == hidden.sum().dtype == torch.float32
        assert torch.layer_norm(hidden, (8,)).dtype == hidden.exp().dtype == torch.float32
        assert torch.cat([x, hidden]).dtype == torch.float32  # the widest input
        assert hidden.relu().dtype == torch.float16  # not on a list: runs as given
        host = torch.randn(2, 2)
        assert (host @ host).dtype == torch.float32  # cuda's autocast leaves host tensors alone
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16
        with torch.autocast("cuda", enabled=False):
            assert layer(x).dtype == torch.float32
    with pytest.warns(FutureWarning), torch.cuda.amp.autocast():
        assert layer(x).dtype == torch.float16
    assert not torch.is_autocast_enabled("cuda") and layer(x).dtype == torch.float32


def test_autocast_casts_are_differentiable_device_ops(cuda_device):
    layer = torch.nn.Linear(8, 4).cuda()
    with torch.autocast("cuda"):
        loss = layer(torch.randn(2, 8, device="cuda")).float().sum()
    loss.backward()
    assert layer.weight.grad.is_cuda and layer.weight.grad.dtype == torch.float32


def _captured_under_one_autocast_region(cache_enabled: bool):
    """The public bug: warm-up and capture inside one autocast region, so the capture reads the
    weight casts the warm-up cached instead of casting; the region's exit frees them, and an
    optimizer step changes the weight the graph no longer reads."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 8).cuda()
    x = torch.randn(4, 8, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.autocast("cuda", cache_enabled=cache_enabled):
        with torch.cuda.stream(stream):
            layer(x)  # warm-up
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph, stream=stream):
            out = layer(x)
    with torch.no_grad():
        layer.weight.add_(1.0)
    with torch.autocast("cuda"):
        expected = layer(x)
    return graph, out, expected, (layer, x)  # the graph's inputs live as long as it


def test_a_weight_cast_cached_before_capture_is_caught_at_replay(cuda_device):
    graph, out, expected, _inputs = _captured_under_one_autocast_region(cache_enabled=True)
    assert out.dtype == expected.dtype == torch.float16
    # On CUDA the replay reads the freed casts of the old weight; the device names the memory.
    with pytest.raises(FreedMemoryError, match=r"torch.float16 .* was allocated outside the graph"):
        graph.replay()


def test_without_the_cast_cache_the_capture_casts_the_weight_at_each_replay(cuda_device):
    graph, out, expected, _inputs = _captured_under_one_autocast_region(cache_enabled=False)
    graph.replay()
    torch.testing.assert_close(out, expected)


def test_autocast_around_or_inside_compiled_code_is_refused_by_name(cuda_device):
    from harness.emulation.compiled_graphs import CompiledGraphError

    torch._dynamo.reset()
    x = torch.randn(2, 2, device="cuda")

    def inside(t):
        with torch.autocast("cuda"):
            return t @ t

    with pytest.raises(Exception, match="torch.autocast\\('cuda'\\) inside a torch.compile'd") as inner:
        torch.compile(inside)(x)
    with torch.autocast("cuda"), pytest.raises(Exception, match="around a torch.compile'd") as outer:
        torch.compile(lambda t: t @ t)(x)
    for raised in (inner, outer):  # dynamo wraps a backend's error; the named one is its cause
        assert any(isinstance(e, CompiledGraphError) for e in _chain(raised.value))
    torch._dynamo.reset()


def _chain(error):
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def _rnn(cls: type, **options) -> torch.nn.Module:
    torch.manual_seed(0)
    return cls(5, 6, num_layers=2, **options).cuda()


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_an_rnn_on_cudnns_path_runs_in_float16_whatever_the_autocast_dtype(cuda_kind, cls, dtype):
    # `_cudnn_rnn`'s autocast kernel casts input, states and weights to float16, bfloat16 or not
    rnn = _rnn(cls, bidirectional=True)
    x = torch.randn(3, 4, 5, device="cuda")
    with torch.backends.cudnn.flags(enabled=True, deterministic=True), \
            torch.autocast("cuda", dtype=dtype):
        out, state = rnn(x)
    states = state if isinstance(state, tuple) else (state,)
    assert out.dtype == torch.float16 and all(s.dtype == torch.float16 for s in states)
    with torch.backends.cudnn.flags(enabled=True, deterministic=True):
        control, _ = _rnn(cls, bidirectional=True).half()(x.half())
    torch.testing.assert_close(out, control)
    out.float().sum().backward()
    assert all(p.grad.dtype == torch.float32 for p in rnn.parameters())


def test_a_packed_sequence_on_cudnns_path_runs_in_float16(cuda_kind):
    rnn = _rnn(torch.nn.LSTM)
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        torch.randn(3, 4, 5, device="cuda"), torch.tensor([3, 2, 1, 3]), enforce_sorted=False)
    with torch.autocast("cuda"):
        out, (h, c) = rnn(packed)
    assert out.data.dtype == h.dtype == c.dtype == torch.float16


def test_a_captured_rnn_step_under_autocast_replays_in_float16(cuda_kind):
    # a transducer's prediction network (one LSTM step per emitted label) graphed under autocast
    rnn = _rnn(torch.nn.LSTM)
    token = torch.randn(1, 4, 5, device="cuda")
    state = tuple(torch.zeros(2, 4, 6, device="cuda") for _ in range(2))
    out = torch.zeros(1, 4, 6, dtype=torch.float16, device="cuda")

    def step():
        with torch.autocast("cuda", cache_enabled=False):
            y, _ = rnn(token, state)
        out.copy_(y)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    token.copy_(torch.randn(1, 4, 5, device="cuda"))
    graph.replay()
    with torch.autocast("cuda"):
        eager, _ = rnn(token, state)
    assert out.dtype == eager.dtype == torch.float16
    torch.testing.assert_close(out, eager)


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU])
def test_an_rnn_off_cudnns_path_runs_in_the_autocast_dtype(cuda_kind, cls):
    # with cuDNN switched off CUDA's own RNN runs its cells through `linear` and the fused cell
    # kernels, each autocast
    rnn = _rnn(cls)
    x = torch.randn(3, 4, 5, device="cuda")
    with torch.backends.cudnn.flags(enabled=False), torch.autocast("cuda", dtype=torch.bfloat16):
        out, _ = rnn(x)
    assert out.dtype == torch.bfloat16


def test_a_bfloat16_input_takes_cudnns_path_and_float16_on_an_ampere_or_later(cuda_kind):
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("cuDNN runs bfloat16 RNNs from compute capability 8.0 on")
    rnn = _rnn(torch.nn.LSTM)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out, _ = rnn(torch.randn(3, 4, 5, device="cuda", dtype=torch.bfloat16))
    assert out.dtype == torch.float16


def test_composites_whose_inner_ops_autocast_widens_return_float32(cuda_kind):
    # CompositeImplicitAutograd ops: autocast casts the op they run inside (pow, a norm, softmax)
    x = torch.randn(4, 8, device="cuda").half()
    with torch.autocast("cuda"):
        widened = {
            "square": torch.square(x), "Tensor.square": x.square(), "norm": torch.norm(x),
            "Tensor.norm": x.norm(dim=-1), "linalg.norm": torch.linalg.norm(x),
            "normalize": F.normalize(x), "softmin": F.softmin(x, -1),
            "special.log1p": torch.special.log1p(x.abs()), "special.expm1": torch.special.expm1(x),
            "special.logsumexp": torch.special.logsumexp(x, -1),
            "special.softmax": torch.special.softmax(x, -1),
            "special.log_softmax": torch.special.log_softmax(x, -1),
        }
        assert {name: t.dtype for name, t in widened.items()} == dict.fromkeys(widened, torch.float32)
        assert x.norm(dtype=torch.float16).dtype == torch.float16  # a dtype named is kept
        assert torch.special.exp2(x).dtype == torch.float16  # exp2 is an op of its own
    torch.testing.assert_close(widened["normalize"], F.normalize(x.float()))


def test_distances_and_interpolation_run_in_float32_and_affine_grid_in_the_autocast_dtype(cuda_kind):
    # pairwise_distance reaches a norm, F.interpolate the upsample kernels (CUDA's float32 list),
    # affine_grid_generator a bmm (its lower-precision list): the H100 gave these dtypes
    x = torch.randn(4, 8, device="cuda").half()
    image = torch.randn(1, 2, 4, 4, device="cuda").half()
    theta = torch.randn(2, 2, 3, device="cuda")
    with torch.autocast("cuda"):
        dtypes = {
            "pairwise_distance": F.pairwise_distance(x, x).dtype,
            "nearest": F.interpolate(image, scale_factor=2).dtype,
            "bilinear": F.interpolate(image, scale_factor=2, mode="bilinear").dtype,
            "bicubic": F.interpolate(image, size=(3, 5), mode="bicubic").dtype,
            "affine_grid": F.affine_grid(theta, (2, 1, 4, 4), align_corners=False).dtype,
        }
        kept = F.pad(image, (1, 1)).dtype
    assert dtypes == {"pairwise_distance": torch.float32, "nearest": torch.float32,
                      "bilinear": torch.float32, "bicubic": torch.float32,
                      "affine_grid": torch.float16}
    assert kept == torch.float16


def test_interpolation_under_deterministic_algorithms_keeps_the_input_dtype(cuda_kind):
    # CUDA's deterministic branch of F.interpolate is a decomposition of ops autocast does not
    # list (no upsample kernel), so half in gives half out, and its backward runs
    image = torch.randn(1, 2, 4, 4, device="cuda").half().requires_grad_()
    torch.use_deterministic_algorithms(True)
    try:
        with torch.autocast("cuda"):
            out = F.interpolate(image, scale_factor=2, mode="bilinear")
            nearest = F.interpolate(image, scale_factor=2, mode="nearest")
        out.float().sum().backward()
    finally:
        torch.use_deterministic_algorithms(False)
    assert (out.dtype, nearest.dtype, image.grad.dtype) == (torch.float16, torch.float32,
                                                            torch.float16)
    assert out.is_cuda and image.grad.is_cuda


def test_binary_cross_entropy_is_refused_under_autocast(cuda_kind):
    probs = torch.rand(4, 3, device="cuda")
    target = torch.rand(4, 3, device="cuda")
    with torch.autocast("cuda"):
        with pytest.raises(RuntimeError, match="binary_cross_entropy and torch.nn.BCELoss are "
                                               "unsafe to autocast"):
            torch.nn.BCELoss()(probs, target)
        with pytest.raises(ValueError, match="Using a target size"):  # torch's own check first
            F.binary_cross_entropy(probs, target[:, :2])
        assert F.binary_cross_entropy_with_logits(probs, target).dtype == torch.float32
    assert F.binary_cross_entropy(probs, target).dtype == torch.float32


def test_each_op_inside_a_python_composite_is_cast(cuda_kind):
    # F.multi_head_attention_forward: its linears and bmms in float16, its softmax in float32
    torch.manual_seed(0)
    attention = torch.nn.MultiheadAttention(8, 2).cuda()
    x = torch.randn(3, 2, 8, device="cuda")
    with torch.autocast("cuda"):
        out, weights = attention(x, x, x)
        assert F.local_response_norm(x.half(), 2).dtype == torch.float32  # its pow
        hidden = F.dropout(x.half() @ x.half().transpose(1, 2), 0.0)
    assert out.dtype == hidden.dtype == torch.float16 and weights.dtype == torch.float32
    assert out.is_cuda and weights.is_cuda
    with torch.no_grad():
        reference = attention.half()(x.half(), x.half(), x.half())[0]
    torch.testing.assert_close(out, reference, atol=2e-3, rtol=2e-3)


def test_a_body_that_skips_the_wrapped_checks_runs_popped_not_forever(cuda_device, monkeypatch):
    # a torch.nn.functional function asking torch.overrides' check directly, not the module's
    import torch.overrides

    def dropout_twice(x: torch.Tensor) -> torch.Tensor:
        if torch.overrides.has_torch_function_unary(x):
            return torch.overrides.handle_torch_function(dropout_twice, (x,), x)
        return F.dropout(F.dropout(x, 0.0), 0.0)

    dropout_twice.__module__ = F.__name__
    monkeypatch.setattr(F, "dropout_twice", dropout_twice, raising=False)
    with torch.autocast("cuda"):
        out = dropout_twice(torch.ones(2, device="cuda"))
    assert out.is_cuda and out.tolist() == [1.0, 1.0]
