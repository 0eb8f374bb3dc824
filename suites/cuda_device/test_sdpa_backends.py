"""Which fused attention kernel CUDA gives an SDPA call, asked or forced, on the emulated device as
on a GPU: `torch.backends.cuda.can_use_flash_attention`/`can_use_efficient_attention` answer by
CUDA's filters (the CPU build said False to every input), flash attention alone takes dropout
(the CPU's flash kernel refuses it) and refuses a causal call of unequal sequence lengths, and
memory-efficient attention alone refuses head dimensions off its GEMM alignment and float64."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def _inputs(heads: int = 2, length: int = 8, head_dim: int = 64, dtype=torch.float16,
            seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, heads, length, head_dim, generator=gen, dtype=torch.float32).to(
        dtype).to("cuda")


def _asked(check, q, k, v, capfd, *, is_causal=False, enable_gqa=False) -> tuple[bool, list[str]]:
    """The query's answer and the reasons it gives with debug=True: CUDA's TORCH_WARN lines,
    which reach stderr through c10's handler, not Python's warnings (H100, torch 2.11)."""
    params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, is_causal, enable_gqa)
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        answer = check(params, True)
    assert not [w for w in caught if issubclass(w.category, UserWarning)], caught
    return answer, [line for line in capfd.readouterr().err.splitlines() if "Warning: " in line]


def test_flash_attention_is_available_and_takes_half_precision(cuda_kind, capfd):
    q = _inputs()
    assert torch.backends.cuda.is_flash_attention_available()
    flash = _asked(torch.backends.cuda.can_use_flash_attention, q, q, q, capfd, is_causal=True)
    assert flash == (True, [])
    assert _asked(torch.backends.cuda.can_use_efficient_attention, q, q, q, capfd) == (True, [])


def test_flash_attention_says_why_it_refuses_float32(cuda_kind, capfd):
    q = _inputs(dtype=torch.float32)
    answer, reasons = _asked(torch.backends.cuda.can_use_flash_attention, q, q, q, capfd)
    assert not answer
    assert any("Expected query, key and value to all be of dtype" in r for r in reasons), reasons
    assert _asked(torch.backends.cuda.can_use_efficient_attention, q, q, q, capfd)[0]


def test_efficient_attention_says_why_it_refuses_a_head_dimension_off_its_alignment(cuda_kind, capfd):
    q = _inputs(head_dim=60)
    answer, reasons = _asked(torch.backends.cuda.can_use_efficient_attention, q, q, q, capfd)
    assert not answer
    assert any("divisible by 8" in r for r in reasons), reasons


def test_flash_attention_alone_runs_dropout(cuda_kind):
    q = _inputs()
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    assert out.shape == q.shape and out.dtype == torch.float16 and out.is_cuda


def test_flash_attention_alone_draws_new_dropout_at_each_replay(cuda_kind):
    q = _inputs(length=64)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)  # warmup, as CUDA code does
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    graph.replay()
    first = out.clone()
    graph.replay()
    assert not torch.equal(first, out)


def test_flash_attention_alone_takes_grouped_query_attention(cuda_kind):
    q, kv = _inputs(heads=4), _inputs(heads=2, seed=1)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    with sdpa_kernel(SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)


def test_flash_attention_alone_refuses_a_causal_call_of_unequal_lengths(cuda_kind):
    """A decode step's query (length 4) against a longer key: CUDA's flash kernel aligns its
    causal mask to the bottom right, so PyTorch refuses is_causal there; the CPU's took it."""
    q, kv = _inputs(length=4), _inputs(length=8, seed=1)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        with pytest.raises(RuntimeError, match="No available kernel"):
            F.scaled_dot_product_attention(q, kv, kv, is_causal=True)
        assert F.scaled_dot_product_attention(q, kv, kv).shape == q.shape


@pytest.mark.parametrize("case", ["head dimension 60", "float64"])
def test_efficient_attention_alone_refuses_what_its_kernel_cannot_take(cuda_kind, case):
    q = _inputs(head_dim=60) if case == "head dimension 60" else _inputs(dtype=torch.float64)
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        with pytest.raises(RuntimeError, match="No available kernel"):
            F.scaled_dot_product_attention(q, q, q)


def test_efficient_attention_alone_takes_float32_and_a_mask(cuda_kind):
    q = _inputs(dtype=torch.float32)
    mask = torch.ones(8, 8, dtype=torch.bool, device="cuda").tril()
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    expected = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    torch.testing.assert_close(out, expected, atol=1e-3, rtol=1e-3)


def test_asking_whether_cudnn_attention_takes_a_call_is_refused_by_name(cuda_device):
    """cuDNN attention's filters follow the cuDNN release a wheel ships; the CPU wheel answered
    False to every input and the CUDA wheel without a GPU failed in the driver."""
    from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice

    q = _inputs()
    params = torch.backends.cuda.SDPAParams(q, q, q, None, 0.0, False, False)
    with pytest.raises(UnsupportedOnEmulatedDevice, match="can_use_cudnn_attention"):
        torch.backends.cuda.can_use_cudnn_attention(params)


def _lower_right_reference(q, kv):
    from torch.nn.attention.bias import causal_lower_right

    mask = causal_lower_right(q.size(-2), kv.size(-2))._materialize(q.device)
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_a_lower_right_causal_bias_attends_as_its_mask(cuda_kind, dtype):
    """torch's CausalBias dispatches itself: a lower-right bias of unequal lengths goes to the
    fused kernels' own ops where CUDA's flash or efficient kernel takes it (float16: flash;
    float32: efficient). On the emulated device the bias was a host tensor beside device ones,
    refused as mixing devices."""
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left

    q, kv = _inputs(length=4, dtype=dtype), _inputs(length=8, dtype=dtype, seed=1)
    out = F.scaled_dot_product_attention(q, kv, kv, attn_mask=causal_lower_right(4, 8))
    assert out.is_cuda and out.dtype == dtype
    torch.testing.assert_close(out, _lower_right_reference(q, kv), atol=2e-2, rtol=2e-2)
    upper = F.scaled_dot_product_attention(q, kv, kv, attn_mask=causal_upper_left(4, 8))
    torch.testing.assert_close(upper, F.scaled_dot_product_attention(q, kv, kv, is_causal=True),
                               atol=2e-2, rtol=2e-2)


def test_a_lower_right_causal_bias_is_captured_and_replayed(cuda_kind):
    """A decode step over a longer cache, graphed: each replay reads the live query and cache."""
    from torch.nn.attention.bias import causal_lower_right

    q, kv = _inputs(length=4), _inputs(length=8, seed=1)
    bias = causal_lower_right(4, 8)
    F.scaled_dot_product_attention(q, kv, kv, attn_mask=bias)  # warmup, as CUDA code does
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = F.scaled_dot_product_attention(q, kv, kv, attn_mask=bias)
    q.copy_(_inputs(length=4, seed=2))
    kv.copy_(_inputs(length=8, seed=3))
    graph.replay()
    torch.testing.assert_close(out, _lower_right_reference(q, kv), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("op", ["_scaled_dot_product_flash_attention",
                                "_scaled_dot_product_efficient_attention"])
def test_a_fused_kernels_own_op_called_directly_is_refused_by_name(cuda_device, op):
    """After `can_use_flash_attention` says yes, code may call the kernel's op itself; a CPU
    build has none, and the dispatcher's answer named the CPU backend, not the emulation."""
    from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice

    q = _inputs()
    args = (q, q, q, 0.0, True) if "flash" in op else (q, q, q, None, False)
    refusal = f"aten::{op} on the emulated CUDA device"
    with pytest.raises(UnsupportedOnEmulatedDevice, match=refusal):
        getattr(torch.ops.aten, op)(*args)


def test_a_causal_bias_takes_the_call_before_autocast(cuda_kind):
    """Under float16 autocast with float32 inputs: the bias's own dispatch runs before autocast
    sees SDPA, so a lower-right bias reaches memory-efficient attention's op uncast (float32 out),
    while an upper-left one calls SDPA again, which autocast casts (float16 out)."""
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left

    q, kv = _inputs(length=4, dtype=torch.float32), _inputs(length=8, dtype=torch.float32, seed=1)
    with torch.autocast("cuda", dtype=torch.float16):
        lower = F.scaled_dot_product_attention(q, kv, kv, attn_mask=causal_lower_right(4, 8))
        upper = F.scaled_dot_product_attention(q, kv, kv, attn_mask=causal_upper_left(4, 8))
    assert (lower.dtype, upper.dtype) == (torch.float32, torch.float16)
    torch.testing.assert_close(lower, _lower_right_reference(q, kv), atol=1e-3, rtol=1e-3)
