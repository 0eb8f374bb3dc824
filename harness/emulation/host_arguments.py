"""Calls whose tensor argument CUDA wants in host memory: refused for a device tensor in its words.

`torch.tensor_split(x, t)` of a tensor `t` (TensorShape.cpp: "tensor_split expected
tensor_indices_or_sections to be on cpu, but it's on cuda:0") and `torch.randint_like(x, high)` of
a tensor `high` (TensorFactories.cpp: "high must be a scalar tensor and on CPU") check the
argument's device before reading it with `.item()` or its data pointer. The emulated device's
tensors are cpu tensors to ATen, so the checks passed and the calls ran (the read a sync); on a GPU
they raise. A host tensor, the form CUDA asks for, keeps its answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class HostArgument:
    """Where the argument sits (position, keyword) and CUDA's refusal, given the device's name."""

    position: int
    keyword: str
    refusal: Callable[[str], str]


_SPLIT = HostArgument(1, "tensor_indices_or_sections", lambda device: (
    f"tensor_split expected tensor_indices_or_sections to be on cpu, but it's on {device}"))
_HIGH = HostArgument(1, "high", lambda device: "high must be a scalar tensor and on CPU")

CALLS: dict[Callable, HostArgument] = {
    torch.tensor_split: _SPLIT, torch.Tensor.tensor_split: _SPLIT, torch.randint_like: _HIGH,
}


def argument(func: Callable, args: tuple, kwargs: dict):
    """The argument of `func` CUDA wants on the host, as given (None where absent)."""
    where = CALLS[func]
    return args[where.position] if len(args) > where.position else kwargs.get(where.keyword)


def refusal(func: Callable, device: str) -> RuntimeError:
    """CUDA's error for the argument given in device memory on `device` ("cuda:0")."""
    return RuntimeError(CALLS[func].refusal(device))


__all__ = ["CALLS", "argument", "refusal"]
