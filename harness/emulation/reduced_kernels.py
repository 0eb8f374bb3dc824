"""Half and bfloat16 kernels CUDA has and the CPU build lacks, run in float32 on the emulated device.

The emulated device runs its tensors on the CPU's kernels. A few of those raise for half or
bfloat16 (`"avg_pool3d_out_frame" not implemented for 'Half'`) where CUDA's kernel exists, so a
model that runs on a GPU raised on the emulated device. For the calls below, with device tensors of
a reduced dtype, the emulated device runs the CPU's float32 kernel on widened copies and gives the
results back in the input's dtype, as CUDA's reduced kernels accumulate in float32 and round once.
The copies are device ops of the call, so the stream tracking sees the inputs read.

The list is what the op database's dtype table (`scripts/autocast_dtype_table.py`) found on torch
2.11's CUDA wheel against the CPU's kernels; a call outside it keeps the CPU's answer. Each kernel is
met by its torch functions and by its aten ops called themselves (`torch.ops.aten.avg_pool3d`, its
overloads, the backward ops), as compiled code and decompositions call them. A tensor the kernel
writes (an in-place op's input, an `out=` tensor, rrelu's noise) gets the widened copy's values
back, and the call returns it where the kernel returns what it wrote."""

from __future__ import annotations

import functools
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


# aten ops (every overload) whose CPU kernel lacks the reduced dtypes; rrelu's has bfloat16.
_ATEN_OPS: dict[str, Callable[[torch.dtype, tuple, dict], bool]] = {
    "avg_pool3d": _always, "avg_pool3d_backward": _always,
    "multi_margin_loss": _always, "multi_margin_loss_backward": _always,
    "multilabel_margin_loss": _always, "multilabel_margin_loss_forward": _always,
    "multilabel_margin_loss_backward": _always,
    "rrelu": _half_only, "rrelu_": _half_only,
    "rrelu_with_noise": _half_only, "rrelu_with_noise_": _half_only,
    "rrelu_with_noise_functional": _half_only,
    "_upsample_bilinear2d_aa": _always, "_upsample_bicubic2d_aa": _always,
    "_upsample_bilinear2d_aa_backward": _always, "_upsample_bicubic2d_aa_backward": _always,
}


def _aten_entries() -> dict[Any, Callable[[torch.dtype, tuple, dict], bool]]:
    entries: dict[Any, Callable[[torch.dtype, tuple, dict], bool]] = {}
    for name, reaches in _ATEN_OPS.items():
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:  # an op this build does not have
            continue
        entries[packet] = reaches
        for overload in packet.overloads():
            entries[getattr(packet, overload)] = reaches
    return entries


# A call, and whether its arguments (their reduced dtype given) reach the kernel the CPU lacks.
WIDENED: dict[Any, Callable[[torch.dtype, tuple, dict], bool]] = {
    _nn.avg_pool3d: _always,
    F.multi_margin_loss: _always, _nn.multi_margin_loss: _always,
    F.multilabel_margin_loss: _always, _nn.multilabel_margin_loss: _always,
    F.rrelu: _half_only, torch.rrelu: _half_only, torch.rrelu_: _half_only,
    _nn._upsample_bilinear2d_aa: _always, _nn._upsample_bicubic2d_aa: _always,
    F.interpolate: _antialiased,
    **_aten_entries(),
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


def widened(func: Callable, op: Any = None) -> Callable:
    """`func` run on float32 copies of its reduced-precision tensors, its float32 results given
    back in their dtype; a copy the kernel wrote (its version counter moved) is written back into
    the tensor it was made from, and stands for it among the results. `op`: the aten op `func`
    runs, where `func` is a wrapper of it."""

    positions, names = _written_arguments(func if op is None else op)

    @functools.wraps(func)
    def run(*args, **kwargs):
        dtype = _reduced_dtype(args, kwargs)
        copies: list[tuple[Tensor, Tensor, bool]] = []  # (original, float32 copy, schema writes it)

        def widen(value, writes: bool):
            if isinstance(value, Tensor) and value.dtype in _REDUCED:
                copy = value.float()
                copies.append((value, copy, writes))
                return copy
            return value

        wide_args = tuple(widen(a, i in positions) for i, a in enumerate(args))
        wide_kwargs = {k: widen(v, k in names) for k, v in kwargs.items()}
        versions = [copy._version for _, copy, _ in copies]
        out = func(*wide_args, **wide_kwargs)
        written = {}
        for (original, copy, writes), version in zip(copies, versions):
            # an argument the kernel writes without moving its version (rrelu's noise) is named
            # by the op's schema
            if writes or copy._version != version:
                if original.shape != copy.shape:  # an `out=` tensor the kernel resized
                    original.resize_(copy.shape)
                original.copy_(copy)
                written[id(copy)] = original
        return _narrowed(out, dtype, written)

    return run


_NONE_WRITTEN: tuple[frozenset[int], frozenset[str]] = (frozenset(), frozenset())


def _written_arguments(func: Any) -> tuple[frozenset[int], frozenset[str]]:
    """The positions and names of the arguments an aten op's schema marks written (`Tensor(a!)`),
    over every overload of a packet; none for a Python function."""
    if isinstance(func, (torch_internals.OpOverloadPacket, torch_internals.OpOverload)):
        return _written_by_op(func)
    return _NONE_WRITTEN


@functools.lru_cache(maxsize=None)
def _written_by_op(func: Any) -> tuple[frozenset[int], frozenset[str]]:
    if isinstance(func, torch_internals.OpOverloadPacket):
        schemas = [getattr(func, name)._schema for name in func.overloads()]
    else:
        schemas = [func._schema]
    positions: set[int] = set()
    names: set[str] = set()
    for schema in schemas:
        for position, argument in enumerate(schema.arguments):
            if argument.alias_info is not None and argument.alias_info.is_write:
                names.add(argument.name)
                if not argument.kwarg_only:
                    positions.add(position)
    return frozenset(positions), frozenset(names)


def _narrowed(out, dtype: torch.dtype, written: dict[int, Tensor]):
    if isinstance(out, Tensor):
        if id(out) in written:
            return written[id(out)]
        return out.to(dtype) if out.dtype == torch.float32 else out
    if isinstance(out, tuple):
        return tuple(_narrowed(o, dtype, written) for o in out)
    return out


__all__ = ["WIDENED", "needs_widening", "widened"]
