"""Integer division by zero on the device raises nothing, as CUDA's kernels do not check.

The CPU's integer division kernels (`div` with a rounding mode, `floor_divide`, `remainder`,
`fmod`, and `//` and `%`) raise `RuntimeError: ZeroDivisionError` for a zero divisor; CUDA's
(cuda/BinaryDivTruncKernel.cu, BinaryDivFloorKernel.cu, BinaryRemainderKernel.cu) compute `a / b`
or `a % b` without a check (PyTorch #135330, #165650), so a runtime that divides by a per-request
count which is zero for a padded slot runs on a GPU and raised on the emulated device, eagerly and
in a replay. What CUDA writes where the divisor is zero is its build's: `c10::div_floor_integer`
returns 0 from torch 2.13 on, the others leave it to the hardware (all bits set, on the GPUs
PyTorch's own tests name); the emulated device writes 0. These rows check what holds on every
build: no error, and the other elements' quotients; the `cuda_kind` rows show it on a GPU."""

from __future__ import annotations

import pytest
import torch

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
}
NONZERO = [1, 3]  # the elements whose divisor is not zero


def _operands(divisors: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.tensor([7, -7, 5, 9], device="cuda"), torch.tensor(divisors, device="cuda"))


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
    assert quotient.cpu()[NONZERO].tolist() == [-4, -5]
    assert remainder.cpu()[NONZERO].tolist() == [1, -1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=["float", "int64"])
@pytest.mark.parametrize("name", ["floor_divide_", "remainder_", "fmod_", "__ifloordiv__", "__imod__"])
def test_an_in_place_division_writes_its_own_tensor(cuda_kind, name, dtype):
    t = torch.tensor([7, -7], dtype=dtype, device="cuda")
    divisor = torch.tensor([2, 2], dtype=dtype, device="cuda")
    expected = getattr(t.cpu().clone(), name)(divisor.cpu())
    assert getattr(t, name)(divisor) is t
    assert t.cpu().tolist() == expected.tolist()
