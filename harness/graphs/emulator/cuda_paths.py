"""Ops whose CPU kernel reads device data on the host where CUDA's does not. The emulator stands
for CUDA, so during a capture on a cpu device they take CUDA's path, which a graph can record.

`F.one_hot(x, num_classes=n)`: the CPU kernel checks the class range with `aminmax(x).item()`; the
CUDA kernel skips the check (a device assert in `scatter_` stands for it) and never syncs. Outside
inference mode autograd decomposes one_hot before the recorder sees it, so a TorchFunctionMode
catches the call itself; the recorder catches it whole under inference mode.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from harness import torch_internals

_ONE_HOT = (F.one_hot, torch_internals.nn_one_hot)


def one_hot_without_sync(x: torch.Tensor, num_classes: int) -> torch.Tensor:
    """CUDA's one_hot with a given class count: zeros, then a scatter of ones."""
    if x.dtype != torch.long:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if num_classes < 1:
        raise RuntimeError(f"num_classes should be positive, got {num_classes}")
    out = torch.zeros(*x.shape, num_classes, dtype=torch.long, device=x.device)
    return out.scatter_(-1, x.unsqueeze(-1), 1)


def _num_classes(args: tuple, kwargs: dict) -> int:
    if len(args) > 1:
        return args[1]
    return kwargs.get("num_classes", -1)


class CudaPaths(TorchFunctionMode):
    """Active during an emulated capture on a cpu device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _ONE_HOT and _num_classes(args, kwargs) > 0 and args[0].numel() > 0:
            return one_hot_without_sync(args[0], _num_classes(args, kwargs))
        return func(*args, **kwargs)
