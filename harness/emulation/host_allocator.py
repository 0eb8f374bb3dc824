"""CUDA's caching host allocator (pinned memory) on the emulated device: its statistics.

`torch.cuda.host_memory_stats()` and its siblings read the pinned-memory allocator that
`pin_memory()`, `torch.empty(..., pin_memory=True)` and non-blocking copies to the host draw from.
On a CPU build torch has none of it (`torch._C._cuda_hostMemoryStats` is absent), so runtimes that
log pinned-memory use failed with an AttributeError inside the emulation.

The model follows PyTorch's CachingHostAllocator: a request is rounded up to the next power of two
and served from a cached free block of exactly that size, or else by a new block from the driver
(`cudaHostAlloc`); a freed block goes back to its size's free list (blocks are never split or
merged); `torch._C._host_emptyCache()` hands every cached block back to the driver. `allocations`
and `allocated_bytes` count the blocks the allocator owns, `active_requests` and `active_bytes`
those handed out; the active peaks are kept per size bucket and summed when read, as torch does
("a best-effort approximation of the true peak"). A freed block is reusable at once: the emulated
device's copies out of pinned memory are done by the time the host frees it, which is what CUDA's
allocator waits for with the events it records on the block's streams.

Not modelled: the driver's time (`host_alloc_time`, `host_free_time` count the driver calls, each
of zero microseconds), and torch 2.11's own reading, measured on an H100, which left
`active_requests` and `active_bytes` unchanged when a block was freed; torch's documentation since
then decreases them, as here.
"""

from __future__ import annotations

import threading
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from harness.emulation.allocator_stats import DurationStat, Stat
from harness.emulation.unsafe_calls import refuse_host_alloc


def _summed(stats) -> Stat:
    out = Stat()
    for stat in stats:
        out.current += stat.current
        out.peak += stat.peak
        out.allocated += stat.allocated
        out.freed += stat.freed
    return out


def rounded_size(nbytes: int) -> int:
    """The block size CUDA's host allocator hands out for a request of `nbytes` (>0)."""
    return 1 << (nbytes - 1).bit_length()


@dataclass
class PinnedHostAllocator:
    """The pinned-memory blocks of the emulated device and the statistics torch reports of them."""

    allocations: Stat = field(default_factory=Stat)
    allocated_bytes: Stat = field(default_factory=Stat)
    host_alloc_time: DurationStat = field(default_factory=DurationStat)
    host_free_time: DurationStat = field(default_factory=DurationStat)
    # Per size bucket: blocks handed out, and their bytes.
    _active: dict[int, Stat] = field(default_factory=lambda: defaultdict(Stat))
    _active_bytes: dict[int, Stat] = field(default_factory=lambda: defaultdict(Stat))
    _cached: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # size -> free blocks
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # The graph being captured, or None: a new block is an unsafe call under some captures.
    capture: Callable[[], Any] = lambda: None

    def allocate(self, storage: torch.UntypedStorage) -> None:
        """`storage` was made pinned: a block handed out until the storage dies."""
        nbytes = storage.nbytes()
        if nbytes == 0:  # torch asks the allocator for nothing
            return
        size = rounded_size(nbytes)
        with self._lock:
            if self._cached[size]:
                self._cached[size] -= 1
            else:
                refuse_host_alloc(self.capture(), size)
                self.allocations.increase(1)
                self.allocated_bytes.increase(size)
                self.host_alloc_time.add(0)
            self._active[size].increase(1)
            self._active_bytes[size].increase(size)
        weakref.finalize(storage, self._free, size)

    def _free(self, size: int) -> None:
        with self._lock:
            self._active[size].decrease(1)
            self._active_bytes[size].decrease(size)
            self._cached[size] += 1

    def empty_cache(self) -> None:
        """`torch._C._host_emptyCache()`: every cached block back to the driver."""
        with self._lock:
            for size, count in self._cached.items():
                self.allocations.decrease(count)
                self.allocated_bytes.decrease(count * size)
                for _ in range(count):
                    self.host_free_time.add(0)
            self._cached.clear()

    def stats(self) -> dict:
        """`torch._C._cuda_hostMemoryStats()`: the nested dictionary, in CUDA's key order."""
        with self._lock:
            return {
                # torch derives these two from the allocations' history
                "num_host_alloc": self.allocations.allocated,
                "num_host_free": self.allocations.freed,
                "allocations": self.allocations.as_dict(),
                "active_requests": _summed(self._active.values()).as_dict(),
                "allocated_bytes": self.allocated_bytes.as_dict(),
                "active_bytes": _summed(self._active_bytes.values()).as_dict(),
                "host_alloc_time": self.host_alloc_time.as_dict(),
                "host_free_time": self.host_free_time.as_dict(),
            }

    def reset_peak(self) -> None:
        with self._lock:
            for stat in self._stats():
                stat.reset_peak()
            for duration in (self.host_alloc_time, self.host_free_time):
                duration.max = duration.min = 0

    def reset_accumulated(self) -> None:
        with self._lock:
            for stat in self._stats():
                stat.reset_accumulated()
            self.host_alloc_time = DurationStat()
            self.host_free_time = DurationStat()

    def _stats(self):
        return (self.allocations, self.allocated_bytes, *self._active.values(),
                *self._active_bytes.values())


__all__ = ["DurationStat", "PinnedHostAllocator", "Stat", "rounded_size"]
