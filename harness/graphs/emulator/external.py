"""Memory a graph uses but does not own: buffers allocated before capture (weights, workspaces,
static inputs). A CUDA graph keeps their addresses, not the buffers; once the last tensor on one is
dropped, the allocator hands the address to the next allocation and replay clobbers it. The
recording aliases each such storage without owning it (as pool.py does for blocks) and keeps a
`StorageWeakRef`, so a replay can tell that the memory was freed and refuse, where CUDA is silent.
It also keeps the address the capture saw: `resize_()` that grows a tensor reallocates its storage
in place (the storage object lives on, its old memory is freed), and a replay refuses that too,
naming the call; a weak reference on the storage object notes the line that dropped its last
reference (a `set_()`, a rebinding, a `del`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import weakref
from dataclasses import dataclass, field

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from harness import torch_internals
from harness.graphs.base import FreedMemoryError
from harness.graphs.emulator.callsite import current_callsite
from harness.graphs.emulator.pool import PoolUse, laid_out_like_once
from harness.graphs.emulator.storage_changes import CapturedTensors
from harness.graphs.emulator.watch_refs import WatchRef


_CAN_KEEP_BYTES = torch_internals.optional_name("storage_swap_data_ptr") is not None


@dataclass(frozen=True)
class ExternalStorage:
    """One storage the graph reads or writes: `liveness` expires when its owner frees it."""

    liveness: StorageWeakRef
    replay_storage: torch.UntypedStorage
    tensor: str  # "shape (4, 8), torch.bfloat16 (on a storage of 64 bytes)"
    first_use: str  # "file:line: source" of the capture's first op on it
    storage_object: weakref.ref  # the Python storage, preserved as long as its memory
    address: int  # where the capture found the storage's bytes
    nbytes: int
    tensor_object: weakref.ref  # the tensor capture first met on it
    freed_at: list[str] = field(default_factory=list)  # the line that dropped the last reference
    # Set when the memory is a block of another graph's private pool, which the capture met as
    # memory it did not allocate: CUDA frees it only once its last tensor is dropped and no graph
    # holds that pool any more (the graphs captured into it reset or destroyed).
    owner_pool: PoolUse | None = None
    # For such a block: its pool's segment, so the bytes stay valid while CUDA would keep them
    # mapped (pool.PoolUse), even after the arena itself was collected.
    segment: object = None
    # Holds True once the memory was freed and `replay_storage` given a copy of its bytes as they
    # were then (ExternalMemory.keep_freed_bytes): a replay may read and write them, as CUDA's
    # replay reads the freed block until the allocator hands it out again.
    kept_at_free: list[bool] = field(default_factory=list)

    def freed(self) -> bool:
        """Whether the memory went back to the allocator (a pool's block: the pool's too)."""
        if self.owner_pool is not None and not self.owner_pool.memory_released():
            return False
        return self.liveness.expired() or self.storage_object() is None

    def bytes_kept(self) -> bool:
        """Whether the memory was freed and its bytes kept for the replay (see `kept_at_free`)."""
        return bool(self.kept_at_free)

    def moved(self) -> bool:
        """Whether the storage now lives elsewhere, its captured memory freed. A block of a pool
        that still holds its memory keeps the bytes the graph reads wherever its storage went
        (torch's trees free an output's storage from the pool's accounting and make it raise on
        access, its data pointer included, while the memory stays the pool's)."""
        if self.owner_pool is not None and not self.owner_pool.memory_released():
            return False
        storage = self.storage_object()
        return storage is not None and storage.data_ptr() != self.address

    def adopted(self, storage: torch.UntypedStorage) -> "ExternalStorage":
        """This entry with `storage`, which the allocator placed at the freed memory's address,
        as the memory a replay reads: what a CUDA graph does, which keeps the address."""
        freed_at: list[str] = []
        return dataclasses.replace(self, liveness=StorageWeakRef(storage),
                                   storage_object=weakref.ref(storage, _note_free(freed_at)),
                                   freed_at=freed_at, kept_at_free=[])


def _note_free(cell: list[str]) -> weakref.CallbackType:
    def note(_: weakref.ref) -> None:
        cell.append(current_callsite())
    return note


def _keep_bytes(cell: list[bool], replay_storage: torch.UntypedStorage, address: int,
                nbytes: int) -> weakref.CallbackType:
    """At the free of a storage the capture read (its memory is still there while its weak
    references are told): give `replay_storage`, the recording's alias of that memory, a copy of
    the bytes, so a replay reads what CUDA's freed block holds instead of the host's heap."""
    alias = weakref.ref(replay_storage)

    def keep(_: weakref.ref) -> None:
        target = alias()
        if target is None:
            return  # the recording is gone
        copy = torch.empty(nbytes, dtype=torch.uint8)
        ctypes.memmove(copy.data_ptr(), address, nbytes)
        torch_internals.storage_swap_data_ptr(target, copy.untyped_storage())
        cell.append(True)

    return keep


def _noting(*callbacks: weakref.CallbackType) -> weakref.CallbackType:
    def call(ref: weakref.ref) -> None:
        for callback in callbacks:
            callback(ref)
    return call


def moved_error(storage: ExternalStorage) -> FreedMemoryError:
    """A storage the capture used, reallocated in place since (it is alive at another address)."""
    now = storage.storage_object()
    where = f" first used by the capture at {storage.first_use}" if storage.first_use else ""
    return FreedMemoryError(
        f"replay() of a graph whose memory moved after capture: the tensor of {storage.tensor}"
        f"{where} was reallocated in place since capture: resize_() (Tensor.resize_ or "
        f"UntypedStorage.resize_) grew its storage from {storage.nbytes} to {now.nbytes()} bytes, "
        f"which moved its memory from {storage.address:#x} to {now.data_ptr():#x} and freed the "
        f"old memory. On CUDA the graph keeps the captured address and replay would write into "
        f"(or read from) freed memory. Size the buffer for its largest use before capture, or "
        f"recapture after growing it", op="replay")


def freed_error(storage: ExternalStorage) -> FreedMemoryError:
    where = f" first used by the capture at {storage.first_use}" if storage.first_use else ""
    if storage.owner_pool is not None:
        dropped = f" (at {storage.freed_at[0]})" if storage.freed_at and storage.freed_at[0] else ""
        return FreedMemoryError(
            f"replay() of a graph whose memory was freed after capture: the tensor of "
            f"{storage.tensor}{where} lives in another graph's private pool, not in this graph's, "
            f"and was freed since capture{dropped}: the last tensor on it was dropped, every "
            f"graph captured into that pool was reset or evicted, and the pool's cached memory "
            f"was released (on the emulated CUDA device: by empty_cache()). On CUDA that memory goes back to the "
            f"allocator and this replay writes into (or reads from) whatever is placed there next. "
            f"Allocate memory several graphs share (a per-stream workspace) outside any capture, "
            f"or capture the graphs that share it into one pool and keep it alive as long as every "
            f"graph that uses it", op="replay")
    dropped = f" (at {storage.freed_at[0]})" if storage.freed_at and storage.freed_at[0] else ""
    tensor = storage.tensor_object()
    if tensor is not None:
        dropped += (f"; the tensor itself is alive, now on other memory of shape {tuple(tensor.shape)}: "
                    f"set_() or `.data = ...` pointed it elsewhere and its captured memory was freed")
    return FreedMemoryError(
        f"replay() of a graph whose memory was freed after capture: the tensor of {storage.tensor}"
        f"{where} was allocated outside the graph, and its last reference was dropped since "
        f"capture{dropped}. "
        f"On CUDA the graph keeps the address, not the buffer, and replay would write into (or read "
        f"from) whatever was allocated there next. Keep the buffer alive as long as the graph, copy "
        f"new values into it instead of reallocating it (a regrown workspace, a reloaded weight), "
        f"or recapture after reallocating", op="replay")


class ExternalMemory:
    """The external storages one capture touched, each aliased without being kept alive."""

    def __init__(self, keep_freed_bytes: bool = False) -> None:
        # Keep the bytes of a storage the capture read when it is freed, for a replay that reads
        # it anyway (the emulated device's races "report" and "off"; needs torch 2.12's swap of a
        # storage's memory): see ExternalStorage.kept_at_free.
        self.keep_freed_bytes = keep_freed_bytes and _CAN_KEEP_BYTES
        self._storages: dict[int, ExternalStorage] = {}
        self._aliases: dict[tuple, torch.Tensor] = {}
        self._expired_during_capture: list[ExternalStorage] = []
        self._held: list[torch.Tensor] = []
        self._held_storages: set[int] = set()
        self._host_scalars: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.tensors = CapturedTensors()  # the tensor objects met, for storage_changes.py

    def storages(self) -> list[ExternalStorage]:
        """Every storage whose liveness a replay must check."""
        return [*self._expired_during_capture, *self._storages.values()]

    def hold(self, tensor: torch.Tensor) -> None:
        """Keep `tensor` alive with the recording: host data lifted into a constant during capture,
        which nobody else holds."""
        self._held.append(tensor)
        self._held_storages.add(torch_internals.storage_key(tensor.untyped_storage()))

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` is host data this recording keeps as a constant (see `hold`)."""
        return (tensor.layout == torch.strided
                and torch_internals.storage_key(tensor.untyped_storage()) in self._held_storages)

    def host_scalar(self, t: torch.Tensor) -> torch.Tensor:
        """A 0-dim host tensor passed to an op on an accelerator device: CUDA passes its value in
        the kernel's arguments when capture meets it, so it is a constant of the graph (a snapshot
        the recording owns), never memory the replay reads or that can be freed under it."""
        constant = self._host_scalars.get(id(t))
        if constant is None or constant[0] is not t:
            constant = (t, t.detach().clone())
            self._host_scalars[id(t)] = constant
        return constant[1]

    def alias(self, t: torch.Tensor, owner_pool: PoolUse | None = None) -> torch.Tensor:
        """A tensor over `t`'s capture-time memory that does not keep it alive. The storage, not
        the tensor object, is what counts: `x.data = new` after capture leaves the graph on the old
        memory, as on CUDA (and the replay refuses, storage_changes.py). `owner_pool`: the memory
        is a block of another graph's pool (see ExternalStorage)."""
        if t.layout != torch.strided:
            return t.detach()  # sparse and other layouts have no single storage to alias
        storage = t.untyped_storage()
        address = torch_internals.storage_key(storage)
        if storage.nbytes() == 0 or address in self._held_storages:
            return t.detach()
        known = self._storages.get(address)
        if known is not None and known.liveness.expired():
            # Freed during capture, and the same StorageImpl address came back for another buffer.
            self._expired_during_capture.append(known)
            self._aliases = {k: v for k, v in self._aliases.items() if k[0] != address}
            known = None
        if known is None:
            freed_at: list[str] = []
            kept: list[bool] = []
            replay_storage = torch_internals.construct_storage_from_data_pointer(
                storage.data_ptr(), t.device, storage.nbytes())
            at_free = _note_free(freed_at)
            if self.keep_freed_bytes and owner_pool is None:
                at_free = _noting(at_free, _keep_bytes(kept, replay_storage, storage.data_ptr(),
                                                       storage.nbytes()))
            known = ExternalStorage(
                StorageWeakRef(storage), replay_storage,
                f"shape {tuple(t.shape)}, {t.dtype} (on a storage of {storage.nbytes()} bytes)",
                current_callsite(),
                weakref.ref(storage, at_free), storage.data_ptr(), storage.nbytes(),
                WatchRef(t), freed_at, owner_pool,
                getattr(storage, "_harness_segment", None) if owner_pool is not None else None,
                kept)
            self._storages[address] = known
        self.tensors.note(t, current_callsite())
        return laid_out_like_once(self._aliases, address, known.replay_storage, t)
