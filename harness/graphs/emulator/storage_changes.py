"""Tensors a capture met whose storage changed in place since: `set_()`, `resize_()` growing it,
`.data = ...`, a storage swap. The graph baked in the address the tensor had at capture; the same
Python object now shows other memory, so what the runtime copies into it never reaches the graph,
and what the graph writes never shows in it. CUDA replays silently; both backends refuse at the
next replay, as PyTorch's cudagraph_trees refuses a static input whose data pointer changed."""

from __future__ import annotations

import weakref
from typing import Any
from dataclasses import dataclass

import torch

from harness.graphs.base import StorageChangedError
from harness.graphs.emulator.watch_refs import WatchRef


@dataclass(frozen=True)
class CapturedTensor:
    """One tensor object a capture read or wrote that it did not allocate, and where it was."""

    tensor: weakref.ref
    address: int
    description: str  # "shape (4, 8), torch.bfloat16"
    # "file:line: source" of the capture's first op on it (a str, or a callsite.LaterCallsite
    # that writes itself out when an error names it)
    first_use: Any

    def changed(self) -> bool:
        tensor = self.tensor()
        return tensor is not None and _address(tensor) != self.address


def _address(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr() + tensor.storage_offset() * tensor.element_size()


class CapturedTensors:
    """The tensor objects one capture met, each once (by identity), not kept alive."""

    def __init__(self) -> None:
        self._seen: dict[int, CapturedTensor] = {}

    def seen(self, tensor: torch.Tensor) -> bool:
        """Whether this very tensor object was noted already."""
        known = self._seen.get(id(tensor))
        return known is not None and known.tensor() is tensor

    def note(self, tensor: torch.Tensor, first_use: str) -> None:
        if tensor.layout != torch.strided or tensor.device.type == "meta" or self.seen(tensor):
            return
        self._seen[id(tensor)] = CapturedTensor(
            WatchRef(tensor), _address(tensor), f"shape {tuple(tensor.shape)}, {tensor.dtype}",
            first_use)

    def frozen(self) -> tuple[CapturedTensor, ...]:
        return tuple(entry for entry in self._seen.values() if entry.tensor() is not None)


_data_ptr = torch.Tensor.data_ptr  # one C call: the storage's address plus the tensor's offset


def first_changed(entries: tuple[CapturedTensor, ...]) -> CapturedTensor | None:
    """The first entry whose tensor is alive on other memory than at capture, or None. Runs before
    every replay, so one call per tensor; the exact check confirms what it finds."""
    for entry in entries:
        tensor = entry.tensor()
        try:
            if tensor is not None and _data_ptr(tensor) != entry.address and entry.changed():
                return entry
        except RuntimeError:
            # Its storage refuses access: torch's cudagraph trees gave an output's memory back
            # to their pool and made every tensor over it raise; nothing can have moved it since.
            continue
    return None


def storage_changed_error(entry: CapturedTensor) -> StorageChangedError:
    tensor = entry.tensor()
    now = _address(tensor) if tensor is not None else 0
    where = f" first used by the capture at {entry.first_use}" if entry.first_use else ""
    return StorageChangedError(
        f"replay() of a graph whose captured tensor changed its storage in place since capture: "
        f"the tensor of {entry.description}{where} was at {entry.address:#x} when captured and is "
        f"now at {now:#x}, shape {tuple(tensor.shape) if tensor is not None else '?'} (set_(), "
        f"resize_() growing it, `.data = ...` or a storage swap). The graph still reads and writes "
        f"{entry.address:#x}: values copied into this tensor never reach it, and what it writes "
        f"never shows here. Size the tensor for its largest use before capture and copy new values "
        f"into it with .copy_(), or recapture after changing its storage", op="replay")
