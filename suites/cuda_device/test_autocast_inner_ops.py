"""CUDA's autocast casts the aten ops a composite runs inside it: a composite that no autocast list
names (`trapezoid`, `sum_to_size`, `ldexp`, `mvlgamma`, `cov`, `linalg.pinv`, `inner`, `trace`'s
CUDA kernel) gives the dtype its inner listed ops (`sum`, `pow`, `matmul`, `tensordot`) give. The
expected dtypes are the op database's rows on an H100 (torch 2.11)."""

from __future__ import annotations

import pytest
import torch

_OTHER = {torch.float16: torch.bfloat16, torch.bfloat16: torch.float16}


def _vector(dtype):
    return torch.linspace(1, 2, 5, device="cuda").to(dtype)


# inner `sum`, `cumsum`, `pow`, `reciprocal`: float32 whatever the autocast dtype
TO_FLOAT32 = {
    "trapezoid": lambda y: torch.trapezoid(y),
    "trapz": lambda y: torch.trapz(y, dx=0.5),
    "cumulative_trapezoid": lambda y: torch.cumulative_trapezoid(y),
    "sum_to_size": lambda y: y.view(5, 1).sum_to_size(1, 1),
    "ldexp": lambda y: torch.ldexp(y, y),
    "mvlgamma": lambda y: torch.mvlgamma(y + 2, 3),
    "__rdiv__": lambda y: 2 / y,
    "trace": lambda y: torch.trace(torch.diag(y)),
}


@pytest.mark.parametrize("autocast_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(TO_FLOAT32))
def test_a_composite_of_float32_ops_returns_float32(cuda_kind, name, dtype, autocast_dtype):
    y = _vector(dtype)
    plain = TO_FLOAT32[name](y)
    assert plain.dtype == dtype  # without autocast: the input's dtype (trace's CUDA kernel too)
    with torch.autocast("cuda", dtype=autocast_dtype):
        out = TO_FLOAT32[name](y)
    assert out.dtype == torch.float32 and out.is_cuda
    torch.testing.assert_close(out.cpu(), plain.float().cpu(), atol=0.05, rtol=0.02)


@pytest.mark.parametrize("autocast_dtype", [torch.float16, torch.bfloat16])
def test_a_composite_of_matmuls_runs_in_the_autocast_dtype(cuda_kind, autocast_dtype):
    m = torch.eye(4, device="cuda") + 0.1
    with torch.autocast("cuda", dtype=autocast_dtype):
        assert torch.linalg.pinv(m).dtype == autocast_dtype  # its float32 input's matmul
        assert torch.cov(m.to(_OTHER[autocast_dtype])).dtype == autocast_dtype
        assert torch.corrcoef(m).dtype == autocast_dtype


@pytest.mark.parametrize("autocast_dtype", [torch.float16, torch.bfloat16])
def test_a_composite_reaching_a_promote_op_refuses_the_other_dtype(cuda_kind, autocast_dtype):
    y = _vector(_OTHER[autocast_dtype])
    with torch.autocast("cuda", dtype=autocast_dtype), pytest.raises(
            RuntimeError, match="Unexpected floating ScalarType in at::autocast::prioritize"):
        torch.inner(y.view(1, 5), y.view(1, 5))  # its tensordot is on the promote list


def test_gradients_flow_through_the_inner_casts(cuda_kind):
    y = _vector(torch.bfloat16).requires_grad_()
    with torch.autocast("cuda", dtype=torch.float16):
        out = torch.trapezoid(y)
    out.backward()
    assert y.grad.dtype == torch.bfloat16 and y.grad.is_cuda
    torch.testing.assert_close(y.grad.float().cpu(), torch.tensor([0.5, 1, 1, 1, 0.5]))


def test_host_tensors_and_listed_ops_are_left_as_they_were(cuda_kind):
    host = torch.linspace(1, 2, 5).bfloat16()
    m = torch.randn(4, 4, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        assert torch.trapezoid(host).dtype == torch.bfloat16  # CUDA's autocast: device tensors only
        assert torch.mm(m, m).dtype == torch.float16
        assert torch.relu(m.half()).dtype == torch.float16
    assert torch.trapezoid(_vector(torch.bfloat16)).dtype == torch.bfloat16  # autocast left


def test_a_cpu_autocast_region_leaves_device_tensors_alone(cuda_kind):
    # CPU autocast's lists are for CPU tensors; the emulated device's tensors are CPU tensors
    m = torch.randn(4, 4, device="cuda")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.mm(m, m).dtype == torch.float32
        assert torch.trapezoid(m.half()).dtype == torch.float16
