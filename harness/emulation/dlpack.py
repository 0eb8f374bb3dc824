"""DLPack on the emulated device: a device tensor says it is a CUDA tensor
(`__dlpack_device__()` is `(kDLCUDA, index)`, so NumPy refuses it as on CUDA), and what
`torch.from_dlpack` makes of one (the tensor itself, or the capsule `to_dlpack` gave) is device
memory again, an alias of the same storage, as on CUDA. A capsule holds a bare pointer, so the
capsules `to_dlpack` made of device tensors are kept (at most KEPT, the oldest dropped) until
`from_dlpack` takes them; one taken elsewhere (a library that is not torch) only ages out.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from harness.emulation.device_indices import index_of
from harness.emulation.device_memory import is_device_memory

KEPT = 4096  # capsules of device tensors remembered while no from_dlpack has taken them


class DeviceCapsules:
    """The capsules made of device tensors, by identity: the storage each points into."""

    def __init__(self) -> None:
        self._made: dict[int, tuple[weakref.ref, int]] = {}

    def made(self, capsule: Any, storage: torch.UntypedStorage) -> None:
        if len(self._made) >= KEPT:
            self._made.pop(next(iter(self._made)))
        self._made[id(capsule)] = (weakref.ref(storage), storage.data_ptr())

    def forget_newest(self, storage: torch.UntypedStorage | None) -> None:
        if storage is not None and self._made:
            newest = next(reversed(self._made))
            if self._made[newest][0]() is storage:
                del self._made[newest]

    def taken(self, capsule: Any) -> torch.UntypedStorage | None:
        found = self._made.pop(id(capsule), None)
        if found is None:
            return None
        storage = found[0]()
        return storage if storage is not None and storage.data_ptr() == found[1] else None


def _on_device_again(out: torch.Tensor, source: torch.UntypedStorage | None, memory) -> torch.Tensor:
    """`out` (torch's cpu tensor over bytes of `source`) on the storage object that is device
    memory, so that the alias is device memory too; a copy (`copy=True`) is device memory of its
    own, as CUDA allocates it."""
    if source is None or is_device_memory(out):
        return out
    offset, itemsize = out.data_ptr() - source.data_ptr(), out.element_size()
    if not 0 <= offset < max(source.nbytes(), 1) or offset % itemsize:
        memory.mark_device(out)
        return out
    with torch.no_grad():
        return out.set_(source, offset // itemsize, out.size(), out.stride())


def patches(state) -> list[tuple[Any, str, Any]]:
    from torch.utils import dlpack

    capsules = DeviceCapsules()
    base_to, base_from = dlpack.to_dlpack, dlpack.from_dlpack
    base_device, base_export = torch.Tensor.__dlpack_device__, torch.Tensor.__dlpack__

    def to_dlpack(tensor: torch.Tensor) -> Any:
        capsule = base_to(tensor)
        if is_device_memory(tensor):
            capsules.made(capsule, tensor.untyped_storage())
        return capsule

    def export(tensor: torch.Tensor, *args, **kwargs) -> Any:
        if not is_device_memory(tensor):
            return base_export(tensor, *args, **kwargs)
        # The consumer's stream (an int, 1 for CUDA's legacy default): torch's own export reads
        # the tensor as a cpu one and refuses any; the emulated device's work is in memory by
        # the time a consumer reads it, which is what the wait would ensure.
        kwargs.pop("stream", None)
        capsule = base_export(tensor, *args[1:], **kwargs)
        capsules.made(capsule, tensor.untyped_storage())
        return capsule

    def from_dlpack(ext: Any, *args, **kwargs) -> torch.Tensor:
        if isinstance(ext, torch.Tensor):
            source = ext.untyped_storage() if is_device_memory(ext) else None
            out = base_from(ext, *args, **kwargs)
            capsules.forget_newest(source)  # the capsule torch made and took just now
            return _on_device_again(out, source, state.memory)
        return _on_device_again(base_from(ext, *args, **kwargs), capsules.taken(ext), state.memory)

    def dlpack_device(tensor: torch.Tensor) -> tuple:
        if is_device_memory(tensor):
            return (dlpack.DLDeviceType.kDLCUDA, index_of(tensor))
        return base_device(tensor)

    return [(dlpack, "to_dlpack", to_dlpack), (dlpack, "from_dlpack", from_dlpack),
            (torch, "from_dlpack", from_dlpack), (torch.Tensor, "__dlpack_device__", dlpack_device),
            (torch.Tensor, "__dlpack__", export)]
