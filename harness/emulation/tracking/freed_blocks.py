"""Freed device blocks that another stream's work may still use, until memory made from them is
touched.

CUDA's caching allocator gives a freed block back to the pool of the stream that allocated it at
once (`record_stream` aside: then it waits for events on the recorded streams). Nothing is wrong
yet: the race is that stream's next allocation taking the block and work touching the new tensor
before the other stream's access is done. So a free with such accesses pending leaves a
`FreedBlock` here, and each later allocation on its stream and in its pool (CUDA's small and large
pools never trade blocks) while the stream is not yet ordered after those accesses may be the one
that takes it: the allocation is noted as a possible reuse, judged at its first touch.

Which later allocation CUDA gives the block depends on the best fit among the pool's free blocks,
their merging with neighbours and splitting, which the emulated device's addresses (host
memory's) do not follow: every allocation of the stream's pool made while the block is pending is
a candidate, the direction that reports whatever CUDA may get wrong. A block leaves once its
stream is ordered after its pending accesses (a wait, an event, a synchronization of the host) or
once a race on it was reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from harness.emulation.caching_allocator import SMALL_SIZE
from harness.emulation.tracking.races import Access, TensorLabel

SMALL_POOL, LARGE_POOL = "small", "large"


def pool_of(nbytes: int) -> str:
    """The pool of CUDA's caching allocator that serves a request of `nbytes`."""
    return SMALL_POOL if nbytes <= SMALL_SIZE else LARGE_POOL


@dataclass(frozen=True, eq=False)  # one per free: compared by identity
class FreedBlock:
    """A freed storage's block: its stream and pool, its label, the free (participant: its stream)
    and the accesses of other streams that its stream was not ordered after at the free."""

    stream: int
    pool: str
    label: TensorLabel
    free: Access
    pending: tuple[Access, ...]


Ordered = Callable[[int, int, int], bool]  # Clocks.ordered(participant, stream, seq)


class FreedBlocks:
    def __init__(self) -> None:
        self._by_stream: dict[int, list[FreedBlock]] = {}
        self.reuses: dict[int, tuple[FreedBlock, ...]] = {}  # storage key -> blocks it may reuse

    def freed(self, block: FreedBlock) -> None:
        self._by_stream.setdefault(block.stream, []).append(block)

    def allocated(self, key: int, stream: int, nbytes: int, ordered: Ordered) -> None:
        """A new storage (`key`) on `stream`: the blocks it may be made of, noted for its first
        touch; those its stream is ordered after by now are safe to reuse and leave."""
        self.reuses.pop(key, None)  # an earlier storage at this address, never touched
        blocks = self._by_stream.get(stream)
        if not blocks:
            return
        left = [b for b in blocks if _unordered(stream, b.pending, ordered)]
        if len(left) != len(blocks):
            if left:
                self._by_stream[stream] = left
            else:
                del self._by_stream[stream]
        pool = pool_of(nbytes)
        candidates = tuple(b for b in left if b.pool == pool)
        if candidates:
            self.reuses[key] = candidates

    def first_touch(self, key: int, participant: int,
                    ordered: Ordered) -> tuple[FreedBlock, Access] | None:
        """The first access to storage `key` is by `participant`: a block it may be made of with an
        access `participant` is not ordered after, and that access (the block leaves, reported)."""
        blocks = self.reuses.pop(key)
        for block in blocks:
            if block not in self._by_stream.get(block.stream, ()):
                continue  # safe for its stream by now, or reported already
            pending = _unordered(participant, block.pending, ordered)
            if pending:
                self._drop(block)
                return block, pending[0]
        return None

    def forget(self, key: int) -> None:
        """Storage `key` died or left the device before anything touched it."""
        self.reuses.pop(key, None)

    def left_on(self, stream: int, ordered: Ordered) -> list[tuple[FreedBlock, Access]]:
        """The blocks of `stream`'s pool still pending for it, each with an access it is not
        ordered after; those it is ordered after by now leave."""
        found = []
        for block in list(self._by_stream.get(stream, ())):
            pending = _unordered(stream, block.pending, ordered)
            if pending:
                found.append((block, pending[0]))
            else:
                self._drop(block)
        return found

    def streams(self) -> list[int]:
        return list(self._by_stream)

    def active(self) -> bool:
        """Whether any block is pending or any storage may be made of one (most of the time not:
        `allocated` is then skipped on every allocation)."""
        return bool(self._by_stream or self.reuses)

    def reported(self, block: FreedBlock) -> None:
        """A race on `block` was reported: one report per free."""
        self._drop(block)

    def _drop(self, block: FreedBlock) -> None:
        blocks = self._by_stream.get(block.stream)
        if blocks is not None and block in blocks:
            blocks.remove(block)
            if not blocks:
                del self._by_stream[block.stream]


def _unordered(participant: int, accesses: tuple[Access, ...], ordered: Ordered) -> list[Access]:
    return [a for a in accesses if not ordered(participant, a.participant, a.seq)]
