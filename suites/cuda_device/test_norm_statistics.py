"""CUDA's batch and layer norm kernels return their saved mean and inverse standard deviation in
float32 for float16 and bfloat16 input (Normalization.cu's batch_norm_cuda, layer_norm_kernel.cu's
layer_norm_cuda: the input's accumulate type); the CPU's kernels return them in the input's dtype.
Expected dtypes: the op database's rows on an H100 (torch 2.11)."""

from __future__ import annotations

import pytest
import torch

_aten = torch.ops.aten


def _batch_norm(x):
    return torch.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-5)


def _batch_norm_legit(x):
    return _aten._native_batch_norm_legit.no_stats(x, None, None, True, 0.1, 1e-5)


def _batch_norm_with_update(x):
    stats = torch.zeros(3, device=x.device, dtype=x.dtype)
    return _aten._batch_norm_with_update(x, None, None, stats, stats.clone() + 1, 0.1, 1e-5)[:3]


def _layer_norm(x):
    return torch.native_layer_norm(x, (4,), None, None, 1e-5)


CALLS = {"native_batch_norm": _batch_norm, "_native_batch_norm_legit": _batch_norm_legit,
         "_batch_norm_with_update": _batch_norm_with_update, "native_layer_norm": _layer_norm}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(CALLS))
def test_statistics_of_reduced_input_are_float32(cuda_kind, name, dtype):
    x = torch.randn(2, 3, 4, device="cuda", dtype=dtype)
    out, mean, invstd = CALLS[name](x)
    assert (out.dtype, mean.dtype, invstd.dtype) == (dtype, torch.float32, torch.float32)
    assert mean.is_cuda and invstd.is_cuda
    reference = CALLS[name](x.float())
    torch.testing.assert_close(mean.cpu(), reference[1].cpu(), atol=1e-2, rtol=1e-2)


def test_float32_input_and_host_calls_keep_their_dtypes(cuda_kind):
    x = torch.randn(2, 3, 4, device="cuda")
    assert [t.dtype for t in _batch_norm(x)] == [torch.float32] * 3
    host = torch.randn(2, 3, 4, dtype=torch.bfloat16)
    assert _layer_norm(host)[1].dtype == torch.bfloat16  # the CPU's own kernel, on the host


def test_batch_norm_backward_through_float32_statistics(cuda_kind):
    x = torch.randn(2, 3, 4, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out, mean, _ = _batch_norm(x)
    (out.float().sum() + mean.sum()).backward()
    assert x.grad.dtype == torch.bfloat16 and x.grad.is_cuda
