"""`torch.cuda.set_sync_debug_mode("warn"|"error")` for device ops that sync inside their kernel.

CUDA flags every operation that makes the host wait for the device: the host reads and copies to
host memory (transfers.py flags those), a blocking copy from host memory to the device, and the ops
whose result size or value the host must read back before it can go on: `nonzero`, boolean-mask
indexing, `masked_select`, `unique`, `repeat_interleave` without `output_size`, a composite that
calls `.item()` on device data inside, a kernel that does (`masked_fill` of a device value, `isin`
sorting many test elements), `Stream.synchronize()`. Measured on an H100 (torch 2.11):
`x.nonzero()`, `x[x > 2]`, `masked_select`, `unique`, `repeat_interleave(repeats)`, blocking copies
to the device from pageable or pinned memory, `torch.tensor(data, device="cuda")` and
`Stream.synchronize()` raise "called a synchronizing CUDA operation" in error mode;
`torch.cuda.synchronize()`, `Event.synchronize()`, `query()`, non-blocking copies and
`torch.equal(x, x)` do not. The emulated device let those ops through, so a test that turns the mode on to prove a
decode loop free of syncs passed on the CPU and failed on a GPU.

Which aten ops sync is what a capture refuses (the graph emulator's `sync_reason`, from the ops'
tags), so while the mode is on each device call runs under a dispatch mode that asks it of every
aten op the call reaches; with the mode off (the default) nothing is entered.
"""

from __future__ import annotations

import torch

from harness.emulation.device_memory import is_device_memory
from harness.emulation.tools import on_host_sync
from harness.graphs.emulator.opinfo import (copies_to_host_inside, equal_on_host, kernel_host_copy,
                                            may_sync, reads_a_device_value, sync_reason)
from harness.torch_internals import TorchDispatchMode, tree_flatten
from harness.graphs.emulator.tensor_subclasses import defer_to_subclass

_LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default
_EQUAL = torch.ops.aten.equal.default
_CHECK_ERRORS = torch.ops.aten._linalg_check_errors.default


def _reads_device(args: tuple, kwargs: dict) -> bool:
    flat, _ = tree_flatten((args, kwargs))
    return any(isinstance(a, torch.Tensor) and is_device_memory(a) for a in flat)


def syncs(func, args: tuple, kwargs: dict) -> bool:
    """Whether the aten op `func` makes the host wait for the device, on these arguments."""
    if func is _LOCAL_SCALAR:  # reading a host scalar (an optimizer's cpu betas) is no sync
        return _reads_device(args, kwargs)
    if func is _CHECK_ERRORS:  # the info codes a solver of this device call wrote (linalg.inv)
        return True
    if func is _EQUAL and equal_on_host(*args) is not None:  # CUDA answers without the device
        return False
    if reads_a_device_value(func, args, kwargs, is_device_memory):  # masked_fill's `value.item()`
        return True
    if copies_to_host_inside(func) and kernel_host_copy(func, args, kwargs) is not None:
        return _reads_device(args, kwargs)  # a blocking copy inside CUDA's kernel (matrix_exp's norms)
    return may_sync(func) and sync_reason(func, args, kwargs, is_device_memory) is not None \
        and _reads_device(args, kwargs)


class _FlagSyncs(TorchDispatchMode):
    def __init__(self, mode: int) -> None:
        super().__init__()
        self.mode = mode
        self.flagged = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if types and defer_to_subclass(types):
            return NotImplemented  # the subclass's own dispatch first (tensor_subclasses.py)
        kwargs = kwargs or {}
        if not self.flagged and syncs(func, args, kwargs):
            self.flagged = True  # one warning for a call, as CUDA warns once per sync
            on_host_sync(self.mode)
        return func(*args, **kwargs)


def call_flagging_syncs(mode: int, call, func, args: tuple, kwargs: dict):
    """`call(func, args, kwargs)` with the syncs its aten ops make flagged under `mode`."""
    with _FlagSyncs(mode):
        return call(func, args, kwargs)


__all__ = ["call_flagging_syncs", "syncs"]
