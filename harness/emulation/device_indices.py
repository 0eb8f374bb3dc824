"""Which emulated device a device tensor is on, with `emulate_cuda(device_count=N)`, N > 1.

All emulated devices share one memory (the cpu's); a storage made on device i > 0 carries its
index as a second mark beside the device-memory mark (a storage without one is on cuda:0, so a
single-device emulation pays nothing). An op takes its inputs' device and refuses, with CUDA's
text, inputs on two devices; copies between devices are real copies (transfers.py).
"""

from __future__ import annotations

from typing import Any

import torch

from harness.emulation.device_memory import is_device_memory, storage_of, wrapped_tensors
from harness.emulation.rules import mixed_devices_error

INDEX_ATTR = "_harness_device_index"


def index_of(t: torch.Tensor) -> int:
    """The device index of a device tensor (0 when unmarked)."""
    storage = storage_of(t)
    return 0 if storage is None else getattr(storage, INDEX_ATTR, 0)


def storage_index(storage: Any) -> int:
    """The device index of a device storage (0 when unmarked)."""
    return getattr(storage, INDEX_ATTR, 0)


def set_storage_index(storage: Any, index: int) -> None:
    """Put a device storage on device `index` (unmarked stays cuda:0, at no cost)."""
    if index or hasattr(storage, INDEX_ATTR):
        setattr(storage, INDEX_ATTR, index)


def set_index(out: Any, index: int) -> None:
    """Put the device tensors of `out` (a tensor or a list/tuple of them) on device `index`."""
    for t in (out if isinstance(out, (list, tuple)) else (out,)):
        if isinstance(t, torch.Tensor):
            inner = wrapped_tensors(t)
            if inner is not None:  # a wrapper subclass: the tensors it holds are on `index` too
                set_index(inner, index)
            storage = storage_of(t)
            if storage is not None and is_device_memory(storage):
                if index or hasattr(storage, INDEX_ATTR):
                    setattr(storage, INDEX_ATTR, index)


def common_index(args: tuple, kwargs: dict) -> int | None:
    """The one device index of the call's device tensors (None without any); tensors on two
    devices raise CUDA's error."""
    found = None
    for a in (*args, *kwargs.values()):
        for t in (a if type(a) in (list, tuple) else (a,)):
            if isinstance(t, torch.Tensor):
                storage = storage_of(t)
                if storage is None or not is_device_memory(storage):
                    continue
                index = getattr(storage, INDEX_ATTR, 0)
                if found is None:
                    found = index
                elif index != found:
                    raise mixed_devices_error(f"cuda:{found}", f"cuda:{index}")
    return found


def first_index(args: tuple, kwargs: dict) -> int:
    """The device index of the call's first device tensor (calls that may mix devices: copies)."""
    found = guard_index(args, kwargs)
    return 0 if found is None else found


def _index_of(t: Any) -> int | None:
    """The device index of `t` when it is a tensor in device memory, else None."""
    if isinstance(t, torch.Tensor):
        storage = storage_of(t)
        if storage is not None and is_device_memory(storage):
            return getattr(storage, INDEX_ATTR, 0)
    return None


def copy_index(args: tuple, kwargs: dict) -> int | None:
    """The device a `copy_(dst, src)` runs on (None for a copy between host tensors): the
    source's when it is device memory (ATen copies between devices on the source device's
    current stream), else the destination's."""
    dst, src = args[0], args[1] if len(args) > 1 else kwargs.get("src")
    found = _index_of(src)
    return _index_of(dst) if found is None else found


def guard_index(args: tuple, kwargs: dict) -> int | None:
    """The device of the call's first device tensor, None without any."""
    for a in (*args, *kwargs.values()):
        for t in (a if type(a) in (list, tuple) else (a,)):
            found = _index_of(t)
            if found is not None:
                return found
    return None
