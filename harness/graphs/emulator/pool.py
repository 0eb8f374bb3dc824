"""The emulator's memory pool: an arena of segments cut into best-fit blocks, freed when the last
tensor on a block dies, the way CUDA's caching allocator treats a graph's private pool.

Each block is handed out as a non-owning storage (`_construct_storage_from_data_pointer`), so a
`StorageWeakRef` on it sees liveness exactly as the CUDA allocator does: views, `.data` and a held
storage keep a block alive. The recorder gets a second non-owning storage over the same bytes, so a
recording never keeps a block alive: a dropped intermediate is reused, within a capture and by later
graphs captured into the same pool. Separate arenas own separate segments and never share memory.
"""

from __future__ import annotations

import bisect
import itertools
import math
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from harness import torch_internals
from harness.graphs.base import CaptureError

# CUDA's allocator rounds every block to 512 bytes; matching it makes reuse decisions comparable.
BLOCK_ALIGN = 512
DEFAULT_SEGMENT_BYTES = 1 << 20
# Attribute set on the Python storage objects the arena hands out. Storage PyObjects are preserved
# with their StorageImpl, so the attribute follows every view and keeps the segment alive.
BLOCK_ATTR = "_harness_pool_block"


def poison_value(dtype: torch.dtype) -> float | int | bool:
    """What capture-time pool memory holds until the first replay: NaN for floats, an extreme for
    ints (the minimum for signed, the maximum for unsigned), True for bool."""
    if dtype.is_floating_point or dtype.is_complex:
        return math.nan
    if dtype == torch.bool:
        return True
    info = torch.iinfo(dtype)
    return info.min if info.min < 0 else info.max


def is_poisoned(tensor: torch.Tensor) -> bool:
    """True when every element still holds the poison value (an empty tensor is not poisoned)."""
    if tensor.numel() == 0:
        return False
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        return bool(torch.isnan(tensor).all())
    return bool((tensor == poison_value(tensor.dtype)).all())


class PoolUse:
    """The graphs holding one pool. CUDA counts a private pool's uses (a capture into it takes one,
    the graph's reset or destruction gives it back); a block freed in it serves only later
    captures into that pool. So memory of the pool that another graph's capture read stays that
    graph's to read while one of these graphs lives (PyTorch's test_graph_two_successive reads an
    output freed during the next capture). At zero uses CUDA's allocator keeps the pool's
    segments until it releases cached memory (`empty_cache()`, or an allocation that finds none
    free), and only then hands the addresses out: `cached` pools model that (the emulated CUDA
    device, whose `empty_cache()` calls `release_cached`); the others count as released at zero
    uses (no allocator cache is modelled there)."""

    def __init__(self, *, cached: bool = False) -> None:
        self._graphs: weakref.WeakSet = weakref.WeakSet()  # weak: a dropped graph gives its use back
        self._cached = cached
        self._released = False

    def release_cached(self) -> None:
        """The allocator released cached memory: an unused pool's segments go back to CUDA."""
        if not self.in_use():
            self._released = True

    def memory_released(self) -> bool:
        """Whether memory freed in this pool can have been handed to another allocation."""
        return not self.in_use() and (self._released or not self._cached)

    def hold(self, graph: object) -> None:
        self._graphs.add(graph)

    def release(self, graph: object) -> None:
        self._graphs.discard(graph)

    def in_use(self) -> bool:
        return len(self._graphs) > 0


@dataclass(eq=False)
class Block:
    """A live allocation: `replay_storage` aliases the user's storage without keeping it alive."""

    segment: int
    offset: int
    nbytes: int
    liveness: StorageWeakRef
    replay_storage: torch.UntypedStorage
    pool: PoolUse | None = None  # the arena's `token`: which pool handed the block out
    # Once its storage died: whether the bytes may be handed out again (None: at once). CUDA's
    # allocator holds back a block freed during capture after use on other streams.
    reusable: Callable[[], bool] | None = None
    # Which allocation last wrote these bytes, as an order: set when a capture allocates the block
    # and, for a contested block, each time its graph replays (shared_blocks.py).
    mark: int = 0
    # A block another graph's capture read (shared), or one allocated over such a block's bytes
    # once it was freed: its graph's replays renew its mark.
    contested: bool = False
    # The blocks allocated over this one's bytes since it was freed (weak: a recording holds them).
    overlaps: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    allocated_at: str = ""  # the capture's line, kept for a block allocated over a shared one
    # Allocated outside any capture by a thread routed to the pool (cudagraph trees' warm-ups and
    # recording inputs, CUDA's beginAllocateCurrentThreadToPool): a graph reading it reads memory
    # it did not allocate, which stays the pool's while the pool is in use.
    routed: bool = False

    @property
    def address(self) -> int:
        return self.replay_storage.data_ptr()

    def release(self) -> None:
        """The block goes back to its pool now, whatever holds it (its owner's death frees
        nothing more): CUDA's raw_delete, or a checkpoint restored without it."""
        self.liveness = _FREED

    @property
    def end(self) -> int:
        return self.offset + self.nbytes

    def overlapped_by(self, other: "Block") -> bool:
        return (other is not self and other.segment == self.segment
                and other.offset < self.end and self.offset < other.end)


class PoolArena:
    """One pool: its segments and live blocks. Graphs captured with the same arena share it."""

    def __init__(self, device: torch.device, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                 cached: bool = False) -> None:
        if segment_bytes < BLOCK_ALIGN:
            raise ValueError(f"segment_bytes={segment_bytes} is below the block size {BLOCK_ALIGN}")
        self.device = torch.device(device)
        self.segment_bytes = segment_bytes
        self._segments: list[torch.Tensor] = []
        self._live: list[list[Block]] = []  # per segment, sorted by offset
        self._streams: list[object] = []  # per segment, the stream it serves (None: any caller)
        # Held by each block: a capture tells its own pool's blocks apart, and a graph reading
        # another pool's block asks whether that pool is still held.
        self.token = PoolUse(cached=cached)
        self._marks = itertools.count(1)
        # Blocks that another capture than their own read, per segment (weak): an allocation over
        # one of them once it is freed is what a replay of its reader must be told about.
        self._shared: dict[int, weakref.WeakSet] = {}
        self.contest_epoch = 0  # counts blocks made contested, so a graph knows to look again

    @property
    def num_segments(self) -> int:
        return len(self._segments)

    def live_blocks(self) -> int:
        self._sweep()
        return sum(not b.liveness.expired() for blocks in self._live for b in blocks)

    def owns(self, tensor: torch.Tensor) -> bool:
        """True when `tensor` lives in memory this pool handed out (a graph's allocation)."""
        block = block_of(tensor)
        return block is not None and any(block in blocks for blocks in self._live)

    def allocate(self, nbytes: int, stream: object = None) -> tuple[torch.UntypedStorage, Block]:
        """A fresh non-owning storage of at least `nbytes`, best fit among the free gaps of the
        segments made for `stream`: as in CUDA's allocator, a segment serves the stream it was
        reserved for, so a block freed on one stream is never handed to another's allocation."""
        segment, offset, size = self._place(nbytes, stream)
        storage = self._non_owning(segment, offset, size)
        replay_storage = self._non_owning(segment, offset, size)
        block = Block(segment, offset, size, StorageWeakRef(storage), replay_storage, self.token)
        setattr(storage, BLOCK_ATTR, block)
        bisect.insort(self._live[segment], block, key=lambda b: b.offset)
        self.note_allocated(block)
        return storage, block

    def _place(self, nbytes: int, stream: object) -> tuple[int, int, int]:
        """(segment, offset, size) of a new block for a request of `nbytes` on `stream`."""
        if nbytes <= 0:
            raise ValueError(f"pool allocations must be positive, got nbytes={nbytes}")
        size = -(-nbytes // BLOCK_ALIGN) * BLOCK_ALIGN
        self._sweep()
        segment, offset = self._best_fit(size, stream)
        if segment is None:
            segment, offset = self._new_segment(size, stream), 0
        return segment, offset, size

    # --- blocks shared between graphs (shared_blocks.py) --------------------------------------

    def note_allocated(self, block: Block) -> None:
        """`block` was just handed out: it is the newest writer of its bytes."""
        block.mark = next(self._marks)
        for shared in self._shared.get(block.segment, ()):
            if shared.overlapped_by(block):
                shared.overlaps.add(block)
                self._contest(block)

    def share(self, block: Block) -> None:
        """`block`, of this pool, is read by a capture other than the one that allocated it."""
        shared = self._shared.setdefault(block.segment, weakref.WeakSet())
        if block not in shared:
            shared.add(block)
            self._contest(block)

    def _contest(self, block: Block) -> None:
        if not block.contested:
            block.contested = True
            self.contest_epoch += 1

    def renew(self, blocks: tuple[Block, ...]) -> None:
        """A replay of the graph that allocated `blocks` wrote them again."""
        for block in blocks:
            block.mark = next(self._marks)

    def overwritten_by(self, block: Block) -> Block | None:
        """The allocation that wrote `block`'s bytes after `block`'s own graph last did, if any:
        the block was freed and handed to a later capture into this pool."""
        newer = [o for o in block.overlaps if o.mark > block.mark]
        return max(newer, key=lambda o: o.mark) if newer else None

    # --- allocations outside a capture and the allocator's checkpoints (pool_checkpoints.py) ----

    def take_over(self, storage: torch.UntypedStorage, stream: object = None) -> Block:
        """Move `storage`, made outside any capture, into a block of this pool: its bytes are
        copied there and its memory swapped for the block's (its own freed with the swap), so
        the bytes outlive the storage as a graph pool's do on CUDA. The block is allocated while
        `storage` lives."""
        nbytes = storage.nbytes()
        segment, offset, size = self._place(nbytes, stream)
        target = self._non_owning(segment, offset, nbytes)
        with torch_internals.DisableTorchFunction(), torch_internals.DisableTorchDispatch():
            target.copy_(storage)
        torch_internals.storage_swap_data_ptr(storage, target)  # `target` now owns the old bytes
        storage._harness_segment = self._segments[segment]
        block = Block(segment, offset, size, StorageWeakRef(storage),
                      self._non_owning(segment, offset, size), self.token, routed=True)
        setattr(storage, BLOCK_ATTR, block)
        bisect.insort(self._live[segment], block, key=lambda b: b.offset)
        self.note_allocated(block)
        return block

    def allocated(self) -> list[Block]:
        """The blocks allocated now (a held block included), by segment and offset."""
        self._sweep()
        return [b for blocks in self._live for b in blocks if not b.liveness.expired()]

    def block_at(self, address: int) -> Block | None:
        """The allocated block starting at `address`, or None."""
        return next((b for b in self.allocated() if b.address == address), None)

    def hold(self, block: Block, owner: "torch.UntypedStorage | None" = None) -> None:
        """`block` (of this pool) is allocated again, owned by `owner` (freed at its death) or,
        for None, by no storage until `free`: what restoring a checkpoint makes of each block
        allocated at the checkpoint."""
        if owner is None:
            block.liveness = _Held()
        else:
            block.liveness = StorageWeakRef(owner)
            setattr(owner, BLOCK_ATTR, block)
            owner._harness_segment = self._segments[block.segment]
        blocks = self._live[block.segment]
        if block not in blocks:
            bisect.insort(blocks, block, key=lambda b: b.offset)

    def _non_owning(self, segment: int, offset: int, nbytes: int) -> torch.UntypedStorage:
        memory = self._segments[segment]
        address = memory.data_ptr() + offset
        storage = torch_internals.construct_storage_from_data_pointer(address, self.device, nbytes)
        # The segment must outlive every storage over it, even after the arena itself is gone.
        storage._harness_segment = memory
        return storage

    def _sweep(self) -> None:
        for i, blocks in enumerate(self._live):
            if any(b.liveness.expired() for b in blocks):
                self._live[i] = [b for b in blocks if not b.liveness.expired()
                                 or (b.reusable is not None and not b.reusable())]

    def _best_fit(self, size: int, stream: object) -> tuple[int | None, int]:
        best: tuple[int, int, int] | None = None  # (gap, segment, offset)
        for segment, blocks in enumerate(self._live):
            if self._streams[segment] != stream:
                continue
            spans = [(b.offset, b.end) for b in blocks]
            spans.append((self._segments[segment].numel(), 0))  # the segment's end closes the last gap
            cursor = 0
            for start, end in spans:
                gap = start - cursor
                if gap >= size and (best is None or gap < best[0]):
                    best = (gap, segment, cursor)
                cursor = end
        return (None, 0) if best is None else (best[1], best[2])

    def _new_segment(self, size: int, stream: object) -> int:
        nbytes = -(-size // self.segment_bytes) * self.segment_bytes
        # Made past the device's modes: an allocation routed to this pool while an op of the
        # device is handled (`take_over`) must not take the segment for a device allocation.
        with torch_internals.DisableTorchFunction(), torch_internals.DisableTorchDispatch():
            self._segments.append(torch.empty(nbytes, dtype=torch.uint8, device=self.device))
        self._live.append([])
        self._streams.append(stream)
        return len(self._segments) - 1


class _Held:
    """Stands for the owner of a block no storage owns (CUDA's allocated block with no deleter
    handed out): never expired until the block is freed."""

    __slots__ = ()

    @staticmethod
    def expired() -> bool:
        return False


class _Freed:
    """Stands for the owner of a block given back to the pool by `PoolArena.free`."""

    __slots__ = ()

    @staticmethod
    def expired() -> bool:
        return True


_FREED = _Freed()


def laid_out_like(storage: torch.UntypedStorage, t: torch.Tensor,
                  device: torch.device | None = None) -> torch.Tensor:
    """A tensor over `storage` with `t`'s dtype, offset, shape and strides (on `device`, default
    `t`'s): how the emulator reaches memory without the tensor that owns it."""
    return torch.empty(0, dtype=t.dtype, device=t.device if device is None else device).set_(
        storage, t.storage_offset(), t.size(), t.stride())


def laid_out_like_once(cache: dict[tuple, torch.Tensor], owner: object,
                       storage: torch.UntypedStorage, t: torch.Tensor) -> torch.Tensor:
    """`laid_out_like(storage, t)`, made once per `owner` and layout of `t` and kept in `cache`
    under `(owner, dtype, offset, shape, strides)`."""
    key = (owner, t.dtype, t.storage_offset(), tuple(t.size()), tuple(t.stride()))
    replay = cache.get(key)
    if replay is None:
        replay = cache[key] = laid_out_like(storage, t)
    return replay


def block_of(tensor: torch.Tensor) -> Block | None:
    """The pool block a tensor lives in, or None for memory that no arena handed out."""
    try:
        storage = tensor.untyped_storage()
    except NotImplementedError as error:
        if torch_internals.is_functorch_wrapped_tensor(tensor):
            # Named here because the emulated graph would otherwise fail on the storage lookup.
            raise CaptureError(
                "a torch.func transform (vmap, grad, jacrev, ...) inside a capture: the emulated "
                "graph records each op's tensors and storages, and the transform's wrapped "
                "tensors have no storage of their own; CUDA captures the kernels the transform "
                "launches. Capture the transformed function natively, or apply the transform "
                "outside the capture on the emulated device") from error
        raise
    block = getattr(storage, BLOCK_ATTR, None)
    if block is None or block.liveness.expired():
        return None
    return block
