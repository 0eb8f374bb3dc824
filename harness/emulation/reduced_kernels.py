"""Half and bfloat16 kernels CUDA has and the CPU build lacks, run in float32 on the emulated device.

The emulated device runs its tensors on the CPU's kernels. A few of those raise for half or
bfloat16 (`"avg_pool3d_out_frame" not implemented for 'Half'`) where CUDA's kernel exists, so a
model that runs on a GPU raised on the emulated device. For the calls below, with device tensors of
a reduced dtype, the emulated device runs the CPU's float32 kernel on widened copies and gives the
results back in the input's dtype, as CUDA's reduced kernels accumulate in float32 and round once.
The copies are device ops of the call, so the stream tracking sees the inputs read.

The list is what the op database's dtype table (`scripts/autocast_dtype_table.py`) found on torch
2.11's CUDA wheel against the CPU's kernels; a call outside it keeps the CPU's answer."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from harness import torch_internals

_nn = torch_internals.nn_module
_REDUCED = (torch.float16, torch.bfloat16)


def _always(dtype: torch.dtype, args: tuple, kwargs: dict) -> bool:
    return True


def _antialiased(dtype: torch.dtype, args: tuple, kwargs: dict) -> bool:
    return bool(kwargs.get("antialias")) or (len(args) > 6 and bool(args[6]))


def _half_only(dtype: torch.dtype, args: tuple, kwargs: dict) -> bool:
    return dtype is torch.float16


# A call, and whether its arguments (their reduced dtype given) reach the kernel the CPU lacks.
WIDENED: dict[Callable, Callable[[torch.dtype, tuple, dict], bool]] = {
    _nn.avg_pool3d: _always,
    F.multi_margin_loss: _always, _nn.multi_margin_loss: _always,
    F.multilabel_margin_loss: _always, _nn.multilabel_margin_loss: _always,
    F.rrelu: _half_only, torch.rrelu: _half_only,
    _nn._upsample_bilinear2d_aa: _always, _nn._upsample_bicubic2d_aa: _always,
    F.interpolate: _antialiased,
}


def _reduced_dtype(args: tuple, kwargs: dict) -> torch.dtype | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor) and value.dtype in _REDUCED:
            return value.dtype
    return None


def needs_widening(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether `func` meets a kernel the CPU lacks for these arguments' reduced dtype."""
    reaches = WIDENED.get(func)
    if reaches is None:
        return False
    dtype = _reduced_dtype(args, kwargs)
    return dtype is not None and reaches(dtype, args, kwargs)


def widened(func: Callable) -> Callable:
    """`func` run on float32 copies of its reduced-precision tensors, its float32 results given
    back in their dtype."""

    def run(*args, **kwargs):
        dtype = _reduced_dtype(args, kwargs)

        def widen(value):
            return value.float() if isinstance(value, Tensor) and value.dtype in _REDUCED else value

        out = func(*(widen(a) for a in args), **{k: widen(v) for k, v in kwargs.items()})
        return _narrowed(out, dtype)

    return run


def _narrowed(out, dtype: torch.dtype):
    if isinstance(out, Tensor):
        return out.to(dtype) if out.dtype == torch.float32 else out
    if isinstance(out, tuple):
        return tuple(_narrowed(o, dtype) for o in out)
    return out


__all__ = ["WIDENED", "needs_widening", "widened"]
