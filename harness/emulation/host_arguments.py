"""Calls whose tensor argument CUDA wants in host memory: refused for a device tensor in its words.

`torch.tensor_split(x, t)` of a tensor `t` (TensorShape.cpp: "tensor_split expected
tensor_indices_or_sections to be on cpu, but it's on cuda:0"), `torch.randint_like(x, high)` of
a tensor `high` (TensorFactories.cpp: "high must be a scalar tensor and on CPU") and
`pack_padded_sequence`'s lengths (PackedSequence.cpp: "'lengths' argument should be a 1D CPU int64
tensor, but got 1D cuda:0 Long tensor", PyTorch #43227, met by many a GPU port) check the
argument's device before reading it with `.item()` or its data pointer. The emulated device's
tensors are cpu tensors to ATen, so the checks passed and the calls ran (the read a sync); on a GPU
they raise. A host tensor, the form CUDA asks for, keeps its answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from harness.emulation import host_outputs
from harness.graphs.emulator.opinfo import scalar_type_name


@dataclass(frozen=True)
class HostArgument:
    """Where the argument sits (position, keyword) and CUDA's refusal, given the tensor and its
    device's name."""

    position: int
    keyword: str
    refusal: Callable[[torch.Tensor, str], str]


_SPLIT = HostArgument(1, "tensor_indices_or_sections", lambda t, device: (
    f"tensor_split expected tensor_indices_or_sections to be on cpu, but it's on {device}"))
_HIGH = HostArgument(1, "high", lambda t, device: "high must be a scalar tensor and on CPU")
_LENGTHS = HostArgument(1, "lengths", lambda t, device: (
    f"'lengths' argument should be a 1D CPU int64 tensor, but got {t.dim()}D {device} "
    f"{scalar_type_name(t.dtype)} tensor"))

def _aten_ops(name: str, where: HostArgument) -> dict:
    """The aten op's packet and overloads, called themselves (as compiled code and decompositions
    call them): the argument is a tensor only in the overloads that take one there."""
    packet = getattr(torch.ops.aten, name)
    return {packet: where, **{getattr(packet, overload): where for overload in packet.overloads()}}


CALLS: dict[Callable, HostArgument] = {
    torch.tensor_split: _SPLIT, torch.Tensor.tensor_split: _SPLIT, torch.randint_like: _HIGH,
    **dict.fromkeys(host_outputs.PACKING_CALLS, _LENGTHS),
    **_aten_ops("tensor_split", _SPLIT), **_aten_ops("randint_like", _HIGH),
}


def argument(func: Callable, args: tuple, kwargs: dict):
    """The argument of `func` CUDA wants on the host, as given (None where absent)."""
    where = CALLS[func]
    return args[where.position] if len(args) > where.position else kwargs.get(where.keyword)


def refusal(func: Callable, value: torch.Tensor, device: str) -> RuntimeError:
    """CUDA's error for the argument `value` given in device memory on `device` ("cuda:0")."""
    return RuntimeError(CALLS[func].refusal(value, device))


__all__ = ["CALLS", "argument", "refusal"]
