"""Integer division by zero on the device raises nothing, as CUDA's kernels do not check, and
writes what the GPU writes.

The CPU's integer division kernels (`div` with a rounding mode, `floor_divide`, `remainder`,
`fmod`, and `//` and `%`) raise `RuntimeError: ZeroDivisionError` for a zero divisor; CUDA's
(cuda/BinaryDivTruncKernel.cu, BinaryDivFloorKernel.cu, BinaryRemainderKernel.cu) compute `a / b`
or `a % b` without a check (PyTorch #135330, #165650), so a runtime that divides by a per-request
count which is zero for a padded slot runs on a GPU and raised on the emulated device, eagerly and
in a replay. Measured on an H100 (torch 2.11, dividends 7 and -7): 32-bit and narrower integers
give all bits set for the quotient and the remainder (-1; 255 for uint8), int64 gives 4294967295
for 7 (nvcc's 32-bit path) and -1 for -7; a floor division subtracts one more for a negative
dividend (-2). From torch 2.13 on `c10::div_floor_integer` returns 0 for a zero divisor (its
header, in the 2.13 and 2.14 wheels). int16 and int8 were not measured: C++ divides them as int,
so they follow the 32-bit rule. The `cuda_kind` rows show it on a GPU."""

from __future__ import annotations

import pytest
import torch
from torch.torch_version import TorchVersion

from harness.emulation import kernels

DIVISIONS = {
    "floor_divide": lambda a, b: torch.floor_divide(a, b),
    "a // b": lambda a, b: a // b,
    "div rounding_mode=trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "Tensor.div rounding_mode=floor": lambda a, b: a.div(b, rounding_mode="floor"),
    "remainder": lambda a, b: torch.remainder(a, b),
    "a % b": lambda a, b: a % b,
    "fmod": lambda a, b: torch.fmod(a, b),
    "in place a //= b": lambda a, b: a.clone().__ifloordiv__(b),
    "int32 a // b": lambda a, b: a.int() // b.int(),
    # the aten ops called themselves, and aot_eager's graph calling them (the placement mode off
    # the stack): until 2026-12-08 the CPU's ZeroDivisionError
    "aten.floor_divide": lambda a, b: torch.ops.aten.floor_divide(a, b),
    "aten.remainder.Tensor": lambda a, b: torch.ops.aten.remainder.Tensor(a, b),
    "aten.div.Tensor_mode floor": lambda a, b: torch.ops.aten.div.Tensor_mode(
        a, b, rounding_mode="floor"),
    "aten.fmod_.Tensor": lambda a, b: torch.ops.aten.fmod_.Tensor(a.clone(), b),
    "aten.floor_divide.out": lambda a, b: torch.ops.aten.floor_divide.out(
        a, b, out=torch.empty_like(a)),
    "aot_eager a // b + a % b": lambda a, b: _aot_eager_divisions()(a, b),
}


def _divisions(a, b):
    return a // b + a % b


def _aot_eager_divisions():
    return torch.compile(_divisions, backend="aot_eager", dynamic=False)
NONZERO = [1, 3]  # the elements whose divisor is not zero


def _operands(divisors: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.tensor([7, -7, 5, 9], device="cuda"), torch.tensor(divisors, device="cuda"))


FLOOR_CHECKS_ZERO = TorchVersion(torch.__version__) >= (2, 13)
# CUDA's values for the dividends [7, -7] (uint8: [7, 7]) over a zero divisor, as an H100 wrote
# them (torch 2.11); floor divisions from torch 2.13 on write 0.
MEASURED = {
    (torch.int64, "trunc"): [4294967295, -1], (torch.int64, "floor"): [4294967295, -2],
    (torch.int64, "remainder"): [4294967295, -1], (torch.int64, "fmod"): [4294967295, -1],
    (torch.int32, "trunc"): [-1, -1], (torch.int32, "floor"): [-1, -2],
    (torch.int32, "remainder"): [-1, -1], (torch.int32, "fmod"): [-1, -1],
    (torch.uint8, "trunc"): [255, 255], (torch.uint8, "floor"): [255, 255],
    (torch.uint8, "remainder"): [255, 255], (torch.uint8, "fmod"): [255, 255],
}
# not measured: C++ promotes them to int, the 32-bit rule
MEASURED.update({(dtype, op): MEASURED[torch.int32, op] for dtype in (torch.int16, torch.int8)
                 for op in ("trunc", "floor", "remainder", "fmod")})
BY_KIND = {
    "trunc": lambda p, q: torch.div(p, q, rounding_mode="trunc"),
    "floor": lambda p, q: p // q,
    "remainder": lambda p, q: p % q,
    "fmod": torch.fmod,
}


def _by_zero(dtype: torch.dtype, kind: str, floor_checks_zero: bool) -> list[int]:
    return [0, 0] if kind == "floor" and floor_checks_zero else MEASURED[dtype, kind]


def _dividends(dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor([7, 7] if dtype == torch.uint8 else [7, -7], device="cuda").to(dtype)


@pytest.mark.parametrize("kind", sorted(BY_KIND))
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.int16, torch.int8],
                         ids=lambda d: str(d).removeprefix("torch."))
def test_a_zero_divisor_gives_cudas_measured_values(cuda_kind, dtype, kind):
    a = _dividends(dtype)
    out = BY_KIND[kind](a, torch.zeros(2, dtype=dtype, device="cuda"))
    torch.cuda.synchronize()
    assert out.dtype == dtype and out.cpu().tolist() == _by_zero(dtype, kind, FLOOR_CHECKS_ZERO)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8], ids=["int64", "int32", "uint8"])
def test_a_floor_division_without_the_zero_check_subtracts_one_for_a_negative_dividend(
        cuda_device, monkeypatch, dtype):
    """torch 2.11's `div_floor_integer` (what the H100 ran), on the emulated device of any torch."""
    monkeypatch.setattr(kernels, "_FLOOR_CHECKS_ZERO", False)
    a = _dividends(dtype)
    for divide in (lambda p, q: p // q, lambda p, q: p.div(q, rounding_mode="floor"),
                   lambda p, q: p.clone().floor_divide_(q)):
        assert divide(a, torch.zeros(2, dtype=dtype, device="cuda")).tolist() == MEASURED[dtype, "floor"]


def test_a_scalar_divisor_and_dividend_give_the_same_values(cuda_kind):
    a = torch.tensor([7, -7], device="cuda")
    assert (a % 0).cpu().tolist() == MEASURED[torch.int64, "remainder"]
    assert torch.div(a, 0, rounding_mode="trunc").cpu().tolist() == MEASURED[torch.int64, "trunc"]
    assert (-7 % torch.zeros(2, dtype=torch.int32, device="cuda")).cpu().tolist() == [-1, -1]


@pytest.mark.parametrize("name", sorted(DIVISIONS))
def test_a_zero_integer_divisor_raises_nothing_on_the_device(cuda_kind, name):
    a, b = _operands([0, 2, 0, -2])
    out = DIVISIONS[name](a, b)
    torch.cuda.synchronize()
    expected = DIVISIONS[name](a.cpu(), torch.tensor([1, 2, 1, -2]))
    assert out.is_cuda and out.dtype == expected.dtype
    assert out.cpu()[NONZERO].tolist() == expected[NONZERO].tolist()


def test_a_host_division_by_zero_still_raises(cuda_kind):
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        torch.tensor([7, 5]) // torch.tensor([0, 1])


def test_a_float_division_by_zero_gives_infinities(cuda_kind):
    out = torch.tensor([1.0, -1.0], device="cuda") // torch.tensor([0.0, 0.0], device="cuda")
    assert out.cpu().tolist() == [float("inf"), float("-inf")]


def test_a_replay_meets_a_zero_divisor_written_after_the_capture(cuda_kind):
    a, b = _operands([2, 2, 3, -2])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        a // b, a % b
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        quotient, remainder = a // b, a % b
    b.copy_(torch.tensor([0, 2, 0, -2], device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert quotient.cpu().tolist() == [0 if FLOOR_CHECKS_ZERO else 4294967295, -4,
                                       0 if FLOOR_CHECKS_ZERO else 4294967295, -5]
    assert remainder.cpu().tolist() == [4294967295, 1, 4294967295, -1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=["float", "int64"])
@pytest.mark.parametrize("name", ["floor_divide_", "remainder_", "fmod_", "__ifloordiv__", "__imod__"])
def test_an_in_place_division_writes_its_own_tensor(cuda_kind, name, dtype):
    t = torch.tensor([7, -7], dtype=dtype, device="cuda")
    divisor = torch.tensor([2, 2], dtype=dtype, device="cuda")
    expected = getattr(t.cpu().clone(), name)(divisor.cpu())
    assert getattr(t, name)(divisor) is t
    assert t.cpu().tolist() == expected.tolist()
