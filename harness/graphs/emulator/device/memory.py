"""The emulated CUDA device's memory: CPU tensors, each device or host memory by its storage.

A storage is marked when the device makes it (an op with device inputs, a factory naming cuda, a
copy to the device, a capture's pool block); everything else is host memory, pinned when marked so
(`pin_memory()`, `pin_memory=True`). The mark is an attribute of the storage's Python object, which
PyTorch keeps with its StorageImpl, so views, `.data`, `module.to("cuda")` (which rebinds
`param.data`) and `set_` share it without any bookkeeping. Live device bytes are counted from weak
references to the marked storages (a storage's Python object dies with its StorageImpl), for `torch.cuda.memory_allocated()` and friends.
"""

from __future__ import annotations

import weakref

import torch

MEMORY_ATTR = "_harness_memory"
DEVICE = "device"
PINNED = "pinned"


def _storage(t: torch.Tensor) -> torch.UntypedStorage | None:
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse, nested and other storage-less layouts
        return None


class DeviceMemory:
    """Which storages are device memory and which host memory is pinned; what the recorder asks
    (emulator/memory.py's interface) and what `torch.cuda.memory_allocated()` answers from."""

    all_device = False

    def __init__(self) -> None:
        self._sizes: dict[weakref.ref, int] = {}
        self._allocated = 0
        self._peak = 0
        self.allocated_total = 0  # bytes ever marked device memory, and ever freed of it
        self.freed_total = 0
        # Set by the placement mode around a call that names the device (a factory with
        # device="cuda", a copy to it): the recorder cannot see the device once it is rewritten.
        self.call_on_device = False
        # Told of each storage made device memory, so stream tracking learns the stream of memory
        # that no op it saw returned (`torch.as_tensor(x, device="cuda")` is made in C++).
        self.adoption_listeners: list = []

    # --- what a tensor is --------------------------------------------------------------------

    def is_device(self, t: torch.Tensor) -> bool:
        storage = _storage(t)
        return storage is not None and getattr(storage, MEMORY_ATTR, None) is DEVICE

    def is_pinned(self, t: torch.Tensor) -> bool:
        storage = _storage(t)
        return storage is not None and getattr(storage, MEMORY_ATTR, None) == PINNED

    def call_targets_device(self) -> bool:
        return self.call_on_device

    # --- marking -----------------------------------------------------------------------------

    def mark_device(self, t: torch.Tensor) -> None:
        storage = _storage(t)
        if storage is not None and getattr(storage, MEMORY_ATTR, None) is not DEVICE:
            self.adopt(storage)

    def adopt(self, storage: torch.UntypedStorage) -> None:
        """Mark `storage` device memory and count its bytes while it lives."""
        setattr(storage, MEMORY_ATTR, DEVICE)
        nbytes = storage.nbytes()
        self._sizes[weakref.ref(storage, self._freed)] = nbytes
        self._allocated += nbytes
        self.allocated_total += nbytes
        if self._allocated > self._peak:
            self._peak = self._allocated
        for listener in self.adoption_listeners:
            listener(storage)

    def _freed(self, ref: weakref.ref) -> None:
        nbytes = self._sizes.pop(ref, 0)
        self._allocated -= nbytes
        self.freed_total += nbytes

    def mark_pinned(self, t: torch.Tensor) -> None:
        storage = _storage(t)
        if storage is not None:
            setattr(storage, MEMORY_ATTR, PINNED)

    # --- statistics --------------------------------------------------------------------------

    def allocated_bytes(self) -> int:
        """Bytes of device storages still alive."""
        return self._allocated

    def peak_bytes(self) -> int:
        return self._peak

    def reset_peak(self) -> None:
        self._peak = self._allocated
