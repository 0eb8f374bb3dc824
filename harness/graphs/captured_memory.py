"""What a real CUDA capture touched, for the cuda backend's replay checks: CUDA cannot tell, the
harness's own graph wrapper can. A light dispatch mode, active during capture only, notes each
tensor object the captured work met that it did not allocate (storage_changes.py: refused at replay
once its storage changed in place) and each storage the capture allocated (memory of this graph's
pool). A later capture that reads memory another graph's pool owns keeps a weak reference on it;
its replay refuses once that memory was freed, where CUDA replays into whatever the allocator
placed there. Freed means both: its last tensor dropped, and no graph holding that pool any more
(CUDA keeps a private pool's freed blocks for later captures into it until its graphs are reset
or destroyed: PyTorch's test_graph_two_successive reads an output freed during the next capture)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from harness import torch_internals
from harness.torch_internals import TorchDispatchMode
from harness.graphs.base import FreedMemoryError
from harness.graphs.emulator.callsite import LaterCallsite, callsite_later
from harness.graphs.emulator.opinfo import op_name
from harness.graphs.emulator.storage_changes import CapturedTensors
from harness.graphs.emulator.tensor_subclasses import defer_to_subclass


@dataclass(frozen=True)
class PoolStorage:
    """A storage some capture allocated: `pool` is that graph's pool handle."""

    liveness: StorageWeakRef
    pool: Any
    description: Any  # AllocationNote: "shape (4,), torch.float32, allocated at file:line: source"


@dataclass(frozen=True)
class ForeignRead:
    """Memory of another graph's pool that a capture read or wrote."""

    owner: PoolStorage
    first_use: Any  # callsite.LaterCallsite: "file:line: source" when written out


class PoolHolders:
    """Per pool handle, the graphs captured into it and not yet reset (weakly: a dropped graph
    gives its use back, as CUDAGraph's destructor does)."""

    def __init__(self) -> None:
        self._graphs: dict[Any, weakref.WeakSet] = {}

    def hold(self, pool: Any, graph: object) -> None:
        self._graphs.setdefault(pool, weakref.WeakSet()).add(graph)

    def release(self, pool: Any, graph: object) -> None:
        holders = self._graphs.get(pool)
        if holders is not None:
            holders.discard(graph)
            if not holders:
                del self._graphs[pool]

    def in_use(self, pool: Any) -> bool:
        return bool(self._graphs.get(pool))

    def freed(self, read: ForeignRead) -> bool:
        """Whether the memory `read` names went back to the allocator."""
        return read.owner.liveness.expired() and not self.in_use(read.owner.pool)


def foreign_freed_error(read: ForeignRead) -> FreedMemoryError:
    where = f" first used by the capture at {read.first_use}" if read.first_use else ""
    return FreedMemoryError(
        f"replay() of a graph whose memory was freed after capture: the tensor of "
        f"{read.owner.description}{where} lives in the private pool {read.owner.pool} of another "
        f"graph, and was freed since capture: the last tensor on it was dropped and every graph "
        f"captured into that pool was reset or evicted. CUDA returns that memory to the allocator, "
        f"and this replay writes into (or reads from) whatever is placed there next. Allocate "
        f"memory several graphs share (a per-stream workspace) outside any capture, or capture the "
        f"graphs that share it into one pool and keep it alive as long as every graph that uses "
        f"it", op="replay")


class CapturedMemory(TorchDispatchMode):
    """During one capture into `pool` (None: a fresh pool): `known` maps a storage's StorageImpl
    address to what earlier captures allocated there (the backend's registry, read only here).
    `failed` names the op whose call raised last, or is None; an op that runs afterwards clears
    it, so an error the captured code caught and handled is not blamed for a later one.

    It runs for every op of a capture, so it walks the caller's frames at most once per op, and
    only for an op that meets a tensor it has not seen, or another pool's memory, or makes one;
    the line is written out only when an error names it (callsite.LaterCallsite)."""

    def __init__(self, pool: Any, known: dict[int, PoolStorage]) -> None:
        super().__init__()
        self._pool = pool
        self._known = known
        self.tensors = CapturedTensors()
        # Weak: a strong reference would keep a dropped intermediate's block from being reused
        # within the capture, as CUDA's allocator reuses it.
        self.allocated: list[tuple[int, StorageWeakRef, AllocationNote]] = []
        self.foreign: list[ForeignRead] = []
        self.failed: str | None = None
        self._own: set[int] = set()
        self._foreign_seen: set[int] = set()

    # Higher-order operators (torch.cond, flex attention) reach __torch_dispatch__ as one call,
    # which the body below takes as any op; without this torch refuses them during a capture.
    supports_higher_order_operators = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if types and defer_to_subclass(types):
            return NotImplemented  # the subclass's own dispatch first (tensor_subclasses.py)
        kwargs = kwargs or {}
        where = None
        input_keys = set()
        for t in _dense_tensors((args, kwargs)):
            storage = t.untyped_storage()
            key = _storage_key(storage)
            input_keys.add(key)
            if key in self._own or storage.nbytes() == 0:
                continue
            if not self.tensors.seen(t):
                if where is None:
                    where = callsite_later(resolve_generated=True)
                self.tensors.note(t, where)
            if self._is_new_foreign_read(key):
                if where is None:
                    where = callsite_later(resolve_generated=True)
                self._foreign_seen.add(key)
                self.foreign.append(ForeignRead(self._known[key], where))
        self.failed = None
        try:
            result = func(*args, **kwargs)
        except Exception:
            self.failed = op_name(func)
            raise
        for t in _dense_tensors(result):
            key = _storage_key(t.untyped_storage())
            if key not in self._own and key not in input_keys:
                self._own.add(key)
                if where is None:
                    where = callsite_later(resolve_generated=True)
                self.allocated.append((key, StorageWeakRef(t.untyped_storage()),
                                       AllocationNote(tuple(t.shape), t.dtype, where)))
        return result

    def _is_new_foreign_read(self, key: int) -> bool:
        """Whether the storage at `key` is live memory another pool's capture allocated, met for
        the first time in this capture."""
        owner = self._known.get(key)
        if owner is None or key in self._foreign_seen or owner.liveness.expired():
            return False
        # One pool: CUDA's shared-pool rules, a later graph may use an earlier one's memory.
        return self._pool is None or owner.pool != self._pool


@dataclass(frozen=True)
class AllocationNote:
    """What a capture allocated, written out (`shape (4,), torch.float32, allocated at file:line:
    source`) only when an error names it."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    where: LaterCallsite

    def __str__(self) -> str:
        return f"shape {self.shape}, {self.dtype}, allocated at {self.where}"


_storage_key = torch_internals.storage_key


def _dense(t: torch.Tensor) -> bool:
    return t.layout is torch.strided and not t.is_meta


def _dense_tensors(tree: Any) -> list[torch.Tensor]:
    """The strided, non-meta tensors in an op's arguments or results: tensors, and lists, tuples
    and dicts of them (what aten schemas and higher-order ops pass), without pytree's cost."""
    if isinstance(tree, torch.Tensor):
        return [tree] if _dense(tree) else []
    if not isinstance(tree, (list, tuple, dict)):
        return []  # None, a Python scalar: what an op that returns no tensor gives
    found: list[torch.Tensor] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        items = node.values() if isinstance(node, dict) else node
        for item in items:
            if isinstance(item, torch.Tensor):
                if _dense(item):
                    found.append(item)
            elif isinstance(item, (list, tuple, dict)):
                stack.append(item)
    return found


def register_allocations(known: dict[int, PoolStorage], capture: CapturedMemory, pool: Any) -> None:
    """Add what `capture` allocated to `known` as memory of `pool`, dropping entries long freed."""
    for key in [k for k, v in known.items() if v.liveness.expired()]:
        del known[key]
    for key, liveness, description in capture.allocated:
        if not liveness.expired():
            known[key] = PoolStorage(liveness, pool, description)
