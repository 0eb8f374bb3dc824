"""Checked without a GPU: the emulator's rules for a cuda device (meta tensors stand for cuda
tensors, and the rule functions are asked about a cuda device), and what a failed capture leaves."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import CaptureError, get_backend
from harness.graphs.emulator import cuda_errors, opinfo

aten = torch.ops.aten
CUDA = torch.device("cuda", 0)


def test_an_index_assigned_host_scalar_is_a_refused_copy_on_a_cuda_device():
    y = torch.zeros(4, device="meta")
    index = torch.tensor([1, 3], device="meta")
    value = torch.tensor(1.0)  # what `y[index] = 1.0` hands to index_put_
    refusal = opinfo.copy_refusal(aten.index_put_.default, (y, [index], value), {}, CUDA)
    assert refusal is not None and refusal[0] == cuda_errors.PAGEABLE_COPY
    assert "pageable" in refusal[1] and "index_fill_" in refusal[1]
    assert opinfo.copy_reason(aten.index_put_.default, (y, [index], value), {},
                              torch.device("cpu")) is None


def test_a_boolean_mask_with_a_host_scalar_is_no_copy_on_a_cuda_device():
    y = torch.zeros(4, device="meta")
    mask = torch.zeros(4, dtype=torch.bool, device="meta")
    value = torch.tensor(-1.0)
    assert opinfo.copy_reason(aten.index_put_.default, (y, [mask], value), {}, CUDA) is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_layer_norm_with_float32_parameters_is_refused_on_a_cuda_device(dtype):
    x = torch.empty(4, 8, dtype=dtype, device="meta")
    weight = torch.empty(8, device="meta")
    args = (x, [8], weight, weight, 1e-5)
    reason = opinfo.kernel_dtype_reason(aten.native_layer_norm.default, args, {}, CUDA)
    assert reason is not None and "expected scalar type" in reason and "but found Float" in reason
    assert opinfo.kernel_dtype_reason(aten.native_layer_norm.default, args, {},
                                      torch.device("cpu")) is None
    same = (x, [8], weight.to(dtype), weight.to(dtype), 1e-5)
    assert opinfo.kernel_dtype_reason(aten.native_layer_norm.default, same, {}, CUDA) is None


def test_a_failed_capture_drops_its_recording():
    backend = get_backend("emulated")
    x = torch.ones(2)
    with pytest.raises(CaptureError) as caught:
        backend.capture(lambda: (x + 1).sum().item())
    recorders = [entry.frame.f_locals["recorder"] for entry in caught.traceback
                 if "recorder" in entry.frame.f_locals]
    assert recorders
    assert all(not r.steps and not r.external.storages() for r in recorders)


def test_a_failed_capture_restores_what_the_capture_patched():
    patched = [(torch.cuda, "is_current_stream_capturing"), (torch, "get_rng_state"),
               (torch, "set_rng_state"), (torch, "manual_seed"), (torch.Tensor, "__repr__"),
               (torch.Tensor, "tolist")]
    before = [getattr(owner, name) for owner, name in patched]
    x = torch.ones(2)
    with pytest.raises(CaptureError):
        get_backend("emulated").capture(lambda: (x + 1).sum().item())
    assert [getattr(owner, name) for owner, name in patched] == before


def test_where_with_a_host_scalar_tensor_is_a_refused_copy_on_a_cuda_device():
    cond = torch.ones(3, dtype=torch.bool, device="meta")
    x = torch.ones(3, device="meta")
    refusal = opinfo.copy_refusal(aten.where.self, (cond, x, torch.tensor(0.0)), {}, CUDA)
    assert refusal is not None and refusal[0] == cuda_errors.PAGEABLE_COPY
    assert "pageable" in refusal[1] and "Python number" in refusal[1]
    assert opinfo.copy_reason(aten.where.self, (cond, x, x), {}, CUDA) is None
    assert opinfo.copy_reason(aten.where.self, (cond, x, torch.tensor(0.0)), {},
                              torch.device("cpu")) is None
