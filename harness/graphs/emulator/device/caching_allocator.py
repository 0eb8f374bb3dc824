"""The accounting of CUDA's native caching allocator (c10's CUDACachingAllocator), for the
emulated CUDA device: which segments it would reserve, how it would cut them into blocks, and the
statistics `torch.cuda.memory_stats()` reports from them. No memory is held here; the data stays in
the device's cpu tensors, and each allocation only moves numbers.

The rules, as CUDA's allocator applies them by default:

- A request is rounded up to 512 bytes. Up to 1 MiB it comes from the small pool, whose segments
  are 2 MiB; a larger one from the large pool, in a 20 MiB segment below 10 MiB and in a segment
  rounded up to 2 MiB from 10 MiB on.
- A request takes the smallest free block that fits (then the lowest address) among the free blocks
  of its pool, of its size class and of the stream it is made on: a block freed on one stream is
  not reused by another. Without one, a new segment is reserved.
- The block is split when the rest is at least 512 bytes (small pool) or more than 1 MiB (large
  pool); a freed block merges with the free blocks beside it in its segment.
- `empty_cache()` gives back every segment that is wholly free, of the regular pool and of graph
  pools no graph uses any more.
- A graph's capture allocates from its private pool (`Pool`, one per pool handle), on the streams
  that take part in the capture; the pool is in use until each graph captured into it is reset or
  destroyed, and a block still alive in it (a graph output kept) keeps its segment.

Not modelled: expandable segments, `cudaMallocAsync`, `max_split_size_mb` and the other allocator
options (each at its default), `record_stream`'s deferred frees (a block is free when its tensor
dies), out of memory by reserved bytes (the host's own allocation decides), one pool set per device
(the emulated devices share one).
"""

from __future__ import annotations

import bisect
import collections
import weakref

MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 << 20  # kSmallSize: the largest request the small pool serves
SMALL_BUFFER = 2 << 20  # kSmallBuffer: a small-pool segment
LARGE_BUFFER = 20 << 20  # kLargeBuffer: the segment for a large request below MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge
STAT_NAMES = ("allocation", "allocated_bytes", "requested_bytes", "inactive_split",
              "inactive_split_bytes", "segment", "reserved_bytes")
FIELDS = ("current", "peak", "allocated", "freed")
SCOPES = ("all", "small_pool", "large_pool")


def round_size(nbytes: int) -> int:
    """The block size CUDA's allocator gives a request of `nbytes`."""
    return MIN_BLOCK if nbytes < MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def segment_size(size: int) -> int:
    """The segment CUDA's allocator reserves for a block of `size` that no free block fits."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class _Stat:
    """One of CUDA's Stat counters."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self) -> None:
        self.current = self.peak = self.allocated = self.freed = 0

    def increase(self, amount: int) -> None:
        self.current += amount
        self.allocated += amount
        if self.current > self.peak:
            self.peak = self.current

    def decrease(self, amount: int) -> None:
        self.current -= amount
        self.freed += amount


class Block:
    """A block of a segment: allocated, or free in `free_list` (its pool's, for its size class and
    stream). `prev`/`next` are its neighbours in the segment."""

    __slots__ = ("size", "requested", "address", "prev", "next", "allocated", "small", "pool",
                 "free_list")

    def __init__(self, size: int, address: int, small: bool, pool: "Pool",
                 free_list: "_FreeList") -> None:
        self.size = size
        self.requested = 0
        self.address = address
        self.prev: Block | None = None
        self.next: Block | None = None
        self.allocated = False
        self.small = small
        self.pool = pool
        self.free_list = free_list


class _FreeList:
    """Free blocks of one pool, size class and stream, ordered by (size, address)."""

    __slots__ = ("keys", "blocks")

    def __init__(self) -> None:
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[int, Block] = {}

    def add(self, block: Block) -> None:
        bisect.insort(self.keys, (block.size, block.address))
        self.blocks[block.address] = block

    def remove(self, block: Block) -> None:
        keys = self.keys
        del keys[bisect.bisect_left(keys, (block.size, block.address))]
        del self.blocks[block.address]

    def take_best_fit(self, size: int) -> Block | None:
        keys = self.keys
        i = bisect.bisect_left(keys, (size,))
        if i == len(keys):
            return None
        return self.blocks.pop(keys.pop(i)[1])


class Pool:
    """The regular pool or one graph pool: its free blocks by (small, stream), how many segments
    it holds, and how many graphs use it."""

    __slots__ = ("free_lists", "segments", "use_count", "__weakref__")

    def __init__(self) -> None:
        self.free_lists: dict[tuple[bool, object], _FreeList] = {}
        self.segments = 0
        self.use_count = 0

    def free_list(self, small: bool, stream) -> _FreeList:
        key = (small, stream)
        free_list = self.free_lists.get(key)
        if free_list is None:
            free_list = self.free_lists[key] = _FreeList()
        return free_list


class CachingAllocator:
    """The allocator's accounting for one emulated device set (see the module docstring)."""

    def __init__(self) -> None:
        self.regular = Pool()
        self._graph_pools: "weakref.WeakKeyDictionary[object, Pool]" = weakref.WeakKeyDictionary()
        self._freeable: set[Pool] = set()
        self._capture_pool: Pool | None = None
        self._capture_streams: set = set()
        self._next_address = 1 << 40
        self.stats = {name: (_Stat(), _Stat(), _Stat()) for name in STAT_NAMES}
        self.num_device_alloc = 0
        self.num_device_free = 0
        stats = self.stats
        # Per size class (small: True), the stats every allocation and free moves.
        self._usage = {small: tuple(stats[name][i] for name in ("allocation", "allocated_bytes",
                                                                 "requested_bytes")
                                    for i in (0, 1 if small else 2))
                       for small in (True, False)}
        self._split = {small: (stats["inactive_split"][0], stats["inactive_split"][1 if small else 2],
                               stats["inactive_split_bytes"][0],
                               stats["inactive_split_bytes"][1 if small else 2])
                       for small in (True, False)}

    # --- allocation --------------------------------------------------------------------------

    def malloc(self, nbytes: int, stream) -> Block:
        """A block for a request of `nbytes` (> 0) made on `stream`."""
        size = MIN_BLOCK if nbytes < MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK
        small = size <= SMALL_SIZE
        pool = self._capture_pool
        if pool is None or stream not in self._capture_streams:
            pool = self.regular
        free_list = pool.free_list(small, stream)
        block = free_list.take_best_fit(size)
        if block is None:
            block = self._new_segment(pool, small, free_list, segment_size(size))
        remaining = block.size - size
        already_split = block.prev is not None or block.next is not None
        if remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE:
            rest = Block(remaining, block.address + size, small, pool, free_list)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            free_list.add(rest)
            split_count, split_count_scope, split_bytes, split_bytes_scope = self._split[small]
            if already_split:
                split_bytes.decrease(size)
                split_bytes_scope.decrease(size)
            else:
                split_count.increase(1)
                split_count_scope.increase(1)
                split_bytes.increase(remaining)
                split_bytes_scope.increase(remaining)
        elif already_split:
            split_count, split_count_scope, split_bytes, split_bytes_scope = self._split[small]
            split_count.decrease(1)
            split_count_scope.decrease(1)
            split_bytes.decrease(block.size)
            split_bytes_scope.decrease(block.size)
        block.allocated = True
        block.requested = nbytes
        count, count_scope, used, used_scope, requested, requested_scope = self._usage[small]
        count.increase(1)
        count_scope.increase(1)
        used.increase(block.size)
        used_scope.increase(block.size)
        requested.increase(nbytes)
        requested_scope.increase(nbytes)
        return block

    def _new_segment(self, pool: Pool, small: bool, free_list: _FreeList, nbytes: int) -> Block:
        block = Block(nbytes, self._next_address, small, pool, free_list)
        self._next_address += nbytes
        pool.segments += 1
        self.num_device_alloc += 1
        scope = 1 if small else 2
        for name in ("segment", "reserved_bytes"):
            amount = 1 if name == "segment" else nbytes
            self.stats[name][0].increase(amount)
            self.stats[name][scope].increase(amount)
        return block

    def free(self, block: Block) -> None:
        """`block`'s tensor died: the block goes back to its free list, merged with its free
        neighbours."""
        block.allocated = False
        small, size = block.small, block.size
        count, count_scope, used, used_scope, requested, requested_scope = self._usage[small]
        count.decrease(1)
        count_scope.decrease(1)
        used.decrease(size)
        used_scope.decrease(size)
        requested.decrease(block.requested)
        requested_scope.decrease(block.requested)
        free_list = block.free_list
        net_count = net_bytes = 0
        prev = block.prev
        if prev is not None and not prev.allocated:
            free_list.remove(prev)
            block.address, block.size, block.prev = prev.address, block.size + prev.size, prev.prev
            if block.prev is not None:
                block.prev.next = block
            net_count -= 1
            net_bytes -= prev.size
        after = block.next
        if after is not None and not after.allocated:
            free_list.remove(after)
            block.size, block.next = block.size + after.size, after.next
            if block.next is not None:
                block.next.prev = block
            net_count -= 1
            net_bytes -= after.size
        free_list.add(block)
        if block.prev is not None or block.next is not None:
            net_count += 1
            net_bytes += block.size
        if net_count or net_bytes:
            for stat, change in zip(self._split[small], (net_count, net_count, net_bytes, net_bytes)):
                if change > 0:
                    stat.increase(change)
                elif change < 0:
                    stat.decrease(-change)

    # --- graph pools -------------------------------------------------------------------------

    def begin_allocate_to_pool(self, handle, streams: set) -> None:
        """A capture into the pool of `handle` begins: allocations on `streams` (the set itself,
        which grows as streams join the capture) come from that pool until it ends."""
        pool = self._graph_pools.get(handle)
        if pool is None:
            pool = self._graph_pools[handle] = Pool()
        pool.use_count += 1
        self._freeable.discard(pool)
        self._capture_pool, self._capture_streams = pool, streams

    def end_allocate_to_pool(self) -> None:
        self._capture_pool, self._capture_streams = None, set()

    def release_pool(self, handle) -> None:
        """A graph captured into `handle`'s pool was reset or destroyed."""
        pool = self._graph_pools.get(handle)
        if pool is None or pool.use_count == 0:
            raise RuntimeError(f"release_pool({handle!r}): no graph uses this pool")
        pool.use_count -= 1
        if pool.use_count == 0:
            self._freeable.add(pool)

    # --- empty_cache and the statistics ------------------------------------------------------

    def empty_cache(self) -> None:
        """Give back every wholly free segment of the regular pool and of unused graph pools."""
        self._release_free_segments(self.regular)
        for pool in tuple(self._freeable):
            self._release_free_segments(pool)
            if pool.segments == 0:
                self._freeable.discard(pool)

    def _release_free_segments(self, pool: Pool) -> None:
        for free_list in pool.free_lists.values():
            whole = [b for b in free_list.blocks.values() if b.prev is None and b.next is None]
            for block in whole:
                free_list.remove(block)
                pool.segments -= 1
                self.num_device_free += 1
                scope = 1 if block.small else 2
                for name, amount in (("segment", 1), ("reserved_bytes", block.size)):
                    self.stats[name][0].decrease(amount)
                    self.stats[name][scope].decrease(amount)

    def allocated_bytes(self) -> int:
        return self.stats["allocated_bytes"][0].current

    def reserved_bytes(self) -> int:
        return self.stats["reserved_bytes"][0].current

    def reset_peak(self) -> None:
        for stats in self.stats.values():
            for stat in stats:
                stat.peak = stat.current

    def reset_accumulated(self) -> None:
        for stats in self.stats.values():
            for stat in stats:
                stat.allocated = stat.freed = 0
        self.num_device_alloc = self.num_device_free = 0

    def memory_stats(self) -> "collections.OrderedDict[str, int]":
        """`torch.cuda.memory_stats()`'s keys and values, sorted by key as torch returns them.
        Active blocks are the allocated ones: no free is deferred here."""
        out: dict[str, int] = {}
        for name, source in (*((n, n) for n in STAT_NAMES), ("active", "allocation"),
                             ("active_bytes", "allocated_bytes")):
            for scope, stat in zip(SCOPES, self.stats[source]):
                for field in FIELDS:
                    out[f"{name}.{scope}.{field}"] = getattr(stat, field)
        for name in ("oversize_allocations", "oversize_segments"):  # none: no max_split_size
            out.update({f"{name}.{field}": 0 for field in FIELDS})
        out.update({"num_alloc_retries": 0, "num_ooms": 0, "num_sync_all_streams": 0,
                    "num_device_alloc": self.num_device_alloc,
                    "num_device_free": self.num_device_free, "max_split_size": -1})
        return collections.OrderedDict(sorted(out.items()))
