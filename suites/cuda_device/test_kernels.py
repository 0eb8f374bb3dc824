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


def _attention_inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 4, 16, 64, generator=gen).to(torch.bfloat16).to("cuda") for _ in range(3)]


def test_sdpa_allowed_only_the_memory_efficient_kernel_runs_as_on_an_h200(cuda_device):
    """`sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)` switches off the CPU's own two SDPA kernels;
    on the emulated device the call still runs (an H200 has the kernel), the CPU's kernels
    standing in, and the caller's switches are as they were afterwards."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _attention_inputs(0)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        got = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert not torch.backends.cuda.math_sdp_enabled()
        assert not torch.backends.cuda.flash_sdp_enabled()
    assert got.is_cuda and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected.float(), atol=2e-2, rtol=2e-2)


def test_sdpa_allowed_only_the_memory_efficient_kernel_captures_and_replays(cuda_device):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _attention_inputs(1)
    later = _attention_inputs(2)
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # warmup, as CUDA code does
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for live, new in zip((q, k, v), later):
        live.copy_(new)
    graph.replay()
    expected = F.scaled_dot_product_attention(*later, is_causal=True)
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("case", ["float32", "a mask"])
def test_sdpa_allowed_only_flash_attention_refuses_what_cudas_flash_kernel_refuses(cuda_kind, case):
    """The CPU's flash kernel takes float32 and masks; CUDA's takes neither, and with no other
    backend allowed SDPA finds no kernel (measured on an H100)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = torch.float32 if case == "float32" else torch.bfloat16
    q = torch.randn(1, 2, 4, 8, device="cuda", dtype=dtype)
    mask = torch.ones(4, 4, device="cuda", dtype=torch.bool) if case == "a mask" else None
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        with pytest.raises(RuntimeError, match="No available kernel"):
            torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)


def test_sdpa_allowed_only_flash_attention_runs_what_cudas_flash_kernel_takes(cuda_kind):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 2, 4, 8, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    with sdpa_kernel(SDPBackend.MATH):
        expected = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)


_aten = torch.ops.aten


def test_the_kernels_called_as_their_aten_ops_answer_as_cudas(cuda_kind):
    """Compiled code and decompositions call the aten ops themselves; until 2026-12-08 the
    emulated device met them with the CPU's kernels (an integer histc's NotImplementedError,
    `mm.dtype`'s missing CPU kernel, lstsq's gelsd, one_hot's host checks)."""
    ids = torch.tensor([0, 1, 1, 3, 3, 3, 7], dtype=torch.int32, device="cuda")
    counts = _aten.histc(ids, 4, 0, 3)
    assert counts.dtype == torch.int32 and counts.cpu().tolist() == [1, 2, 0, 3]
    a = torch.randn(4, 8, device="cuda").half()
    b = torch.randn(8, 2, device="cuda").half()
    product = _aten.mm.dtype(a, b, torch.float32)
    assert product.dtype == torch.float32
    torch.testing.assert_close(product, a.float() @ b.float(), atol=1e-2, rtol=1e-2)
    A, B = torch.randn(5, 3, device="cuda"), torch.randn(5, 2, device="cuda")
    with pytest.raises(RuntimeError, match="`driver` other than `gels` is not supported on CUDA"):
        _aten.linalg_lstsq(A, B, driver="gelsd")
    solution, residuals, rank, _ = _aten.linalg_lstsq(A, B)
    assert solution.shape == (3, 2) and residuals.shape == (2,) and rank.numel() == 0
