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
dies), out of memory by reserved bytes (the host's own allocation decides), the bytes a capture's
allocations asked for (its pool arena hands out blocks already rounded to 512 bytes).

Each device has its own `CachingAllocator`, as CUDA keeps a DeviceCachingAllocator per device: its
regular pool, its graph pools and MemPools (a pool id names one pool per device), its statistics
and its memory history.
"""

from __future__ import annotations

import collections
import weakref
from bisect import bisect_left, insort

from harness.emulation.allocator_stats import Stat

MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 << 20  # kSmallSize: the largest request the small pool serves
SMALL_BUFFER = 2 << 20  # kSmallBuffer: a small-pool segment
LARGE_BUFFER = 20 << 20  # kLargeBuffer: the segment for a large request below MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge
ADDRESS_BITS = 52  # the model's addresses: segments one after the other, never reused
DEVICE_ADDRESS_BITS = 44  # device i's addresses start at i << 44 (16 TiB each, 256 devices)
# The stats every allocation or free moves, by their index in a `_Counters`' lists.
HOT_STATS = ("allocation", "allocated_bytes", "requested_bytes", "inactive_split",
             "inactive_split_bytes")
SEGMENT_STATS = ("segment", "reserved_bytes")
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


class _Counters:
    """The HOT_STATS of one size class, one list entry per stat: `current`, `allocated` (the sum
    of increases) and `peak`. What CUDA calls freed (the sum of decreases) is
    `allocated - current + base`, `base` being `current` when the accumulated stats were reset:
    a decrease only has to move `current`."""

    __slots__ = ("current", "allocated", "peak", "base")

    def __init__(self) -> None:
        self.current = [0] * len(HOT_STATS)
        self.allocated = [0] * len(HOT_STATS)
        self.peak = [0] * len(HOT_STATS)
        self.base = [0] * len(HOT_STATS)


class EarlyCounts:
    """What each allocation and free moves in the first three HOT_STATS (allocations, allocated
    and requested bytes), per size class, kept before the block model starts (device_memory.py:
    it starts when first asked), so that the peaks and totals reached before then are not lost.
    A few integer operations per allocation; the blocks are built only when asked for."""

    __slots__ = ("small", "large", "all_peak")

    def __init__(self) -> None:
        self.small, self.large = _Counters(), _Counters()
        self.all_peak = [0, 0, 0]

    def allocate(self, nbytes: int) -> None:
        self.play((nbytes,))

    def free(self, nbytes: int) -> None:
        self.play((~nbytes,))

    def play(self, events) -> None:
        """`allocate(n)` for each `n >= 0` of `events` and `free(~n)` for each negative one (a
        free of 0 bytes is ~0, -1), in order: the allocations and frees logged since the last
        play (device_memory.py), one loop over the lot instead of a call per event."""
        small, large, all_peak = self.small, self.large, self.all_peak
        for event in events:
            nbytes = ~event if event < 0 else event
            size = MIN_BLOCK if nbytes < MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK
            if event < 0:
                current = (small if size <= SMALL_SIZE else large).current
                current[0] -= 1
                current[1] -= size
                current[2] -= nbytes
                continue
            if size <= SMALL_SIZE:
                mine, others = small, large.current
            else:
                mine, others = large, small.current
            current, allocated, peak = mine.current, mine.allocated, mine.peak
            count, rounded, requested = current[0] + 1, current[1] + size, current[2] + nbytes
            current[0], current[1], current[2] = count, rounded, requested
            allocated[0] += 1
            allocated[1] += size
            allocated[2] += nbytes
            if count > peak[0]:
                peak[0] = count
            if rounded > peak[1]:
                peak[1] = rounded
            if requested > peak[2]:
                peak[2] = requested
            count += others[0]
            rounded += others[1]
            requested += others[2]
            if count > all_peak[0]:
                all_peak[0] = count
            if rounded > all_peak[1]:
                all_peak[1] = rounded
            if requested > all_peak[2]:
                all_peak[2] = requested


class Block:
    """A block of a segment: allocated, or free in `free_list` (its pool's, for its size class and
    stream). `prev`/`next` are its neighbours in the segment."""

    __slots__ = ("size", "requested", "address", "prev", "next", "allocated", "small", "pool",
                 "free_list")

    def __init__(self, size: int, address: int, small: bool, pool: "Pool",
                 free_list: "_FreeList", prev: "Block | None", after: "Block | None") -> None:
        self.size = size
        self.requested = 0
        self.address = address
        self.prev = prev
        self.next = after
        self.allocated = False
        self.small = small
        self.pool = pool
        self.free_list = free_list


class _FreeList:
    """Free blocks of one pool, size class and stream, by `size << ADDRESS_BITS | address` (one
    int: cheaper to compare than a pair): `keys` sorted, `blocks` by key. Best fit is the first key
    not below `size << ADDRESS_BITS`."""

    __slots__ = ("keys", "blocks")

    def __init__(self) -> None:
        self.keys: list[int] = []
        self.blocks: dict[int, Block] = {}


class Pool:
    """The regular pool or one graph pool of device `device`: its free lists by stream (small,
    large), how many segments it holds, and how many graphs use it."""

    __slots__ = ("free_lists", "segments", "use_count", "last_stream", "last_lists", "id",
                 "device", "__weakref__")

    def __init__(self, pool_id: tuple[int, int] = (0, 0), device: int = 0) -> None:
        self.id = pool_id  # CUDA's MempoolId_t: (0, 0) the regular pool
        self.device = device  # whose allocator holds it: a block's free goes back there
        self.free_lists: dict[object, tuple[_FreeList, _FreeList]] = {}
        self.segments = 0
        self.use_count = 0
        # Most allocations follow on the last one's stream, whose hash is a Python call.
        self.last_stream: object = None
        self.last_lists: tuple[_FreeList, _FreeList] | None = None


class CachingAllocator:
    """The allocator's accounting for one emulated device (see the module docstring)."""

    def __init__(self, device: int = 0) -> None:
        self.device = device
        self.regular = Pool((0, 0), device)
        self._graph_pools: "weakref.WeakKeyDictionary[object, Pool]" = weakref.WeakKeyDictionary()
        self._freeable: set[Pool] = set()
        self.capture_pool: Pool | None = None
        self.capture_streams: set = set()
        # each device's segments in an address range of its own, as a snapshot lists them
        self._next_address = device << DEVICE_ADDRESS_BITS
        self._small, self._large = _Counters(), _Counters()
        self._pairs = {True: (self._small, self._large), False: (self._large, self._small)}
        self._all_peak = [0] * len(HOT_STATS)
        self.segment_stats = {name: (Stat(), Stat(), Stat()) for name in SEGMENT_STATS}
        self.num_device_alloc = 0
        self.num_device_free = 0
        # CUDA's release_cached_blocks first synchronizes every stream's outstanding frees
        # (synchronize_and_free_events), counted whether or not any were outstanding
        self.num_sync_all_streams = 0
        self.num_ooms = 0  # allocations refused for want of memory (DeviceCachingAllocator::malloc)
        # Segment start address -> (size, small, stream, pool): what snapshots list.
        self.segments: dict[int, tuple[int, bool, object, Pool]] = {}
        self.history = None  # a MemoryHistory while torch.cuda.memory._record_memory_history runs
        self.caching = True  # torch.cuda.memory.caching_allocator_enable

    # --- allocation (on every device allocation and free: kept to plain list and dict work) ----

    def malloc(self, nbytes: int, stream, pool: "Pool | None") -> Block:
        """A block for a request of `nbytes` (> 0) made on `stream`, from `pool` (a graph pool:
        `capture_pool` when `stream` is in `capture_streams`) or the regular pool (None). Not
        re-entrant: nothing it calls frees."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        if pool is None:
            pool = self.regular
        if stream is pool.last_stream:
            lists = pool.last_lists
        else:
            lists = pool.free_lists.get(stream)
            if lists is None:
                lists = pool.free_lists[stream] = (_FreeList(), _FreeList())
            pool.last_stream, pool.last_lists = stream, lists
        free_list = lists[0] if small else lists[1]
        keys = free_list.keys
        i = bisect_left(keys, size << ADDRESS_BITS)
        if i < len(keys):
            block = free_list.blocks.pop(keys.pop(i))
        else:
            block = self._new_segment(pool, small, free_list, segment_size(size), stream)
        mine, other = self._pairs[small]
        current = mine.current
        remaining = block.size - size
        after = block.next
        already_split = after is not None or block.prev is not None
        if remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE:
            rest = Block(remaining, block.address + size, small, pool, free_list, block, after)
            if after is not None:
                after.prev = rest
            block.next = rest
            block.size = size
            key = remaining << ADDRESS_BITS | rest.address
            insort(keys, key)
            free_list.blocks[key] = rest
            if already_split:  # a split free block shrinks
                current[4] -= size
            else:  # a new split free block
                current[3] += 1
                current[4] += remaining
                mine.allocated[3] += 1
                mine.allocated[4] += remaining
                self._split_peaks(mine, other)
        else:  # the block is taken whole, larger than asked for when the rest is too small
            size = block.size
            if already_split:
                current[3] -= 1
                current[4] -= size
        block.allocated = True
        block.requested = nbytes
        if self.history is not None:
            self.history.alloc(block, stream)
        count, used, requested = current[0] + 1, current[1] + size, current[2] + nbytes
        current[0], current[1], current[2] = count, used, requested
        allocated = mine.allocated
        allocated[0] += 1
        allocated[1] += size
        allocated[2] += nbytes
        peak, all_peak, others = mine.peak, self._all_peak, other.current
        if used > peak[1] or count > peak[0] or requested > peak[2]:
            peak[0], peak[1], peak[2] = (
                max(peak[0], count), max(peak[1], used), max(peak[2], requested))
        count, used, requested = count + others[0], used + others[1], requested + others[2]
        if used > all_peak[1] or count > all_peak[0] or requested > all_peak[2]:
            all_peak[0], all_peak[1], all_peak[2] = (
                max(all_peak[0], count), max(all_peak[1], used), max(all_peak[2], requested))
        return block

    def _split_peaks(self, mine: _Counters, other: _Counters) -> None:
        """After inactive_split (index 3) or its bytes (4) grew."""
        current, peak, all_peak, others = mine.current, mine.peak, self._all_peak, other.current
        if current[3] > peak[3]:
            peak[3] = current[3]
        if current[4] > peak[4]:
            peak[4] = current[4]
        if current[3] + others[3] > all_peak[3]:
            all_peak[3] = current[3] + others[3]
        if current[4] + others[4] > all_peak[4]:
            all_peak[4] = current[4] + others[4]

    def _new_segment(self, pool: Pool, small: bool, free_list: _FreeList, nbytes: int,
                     stream) -> Block:
        block = Block(nbytes, self._next_address, small, pool, free_list, None, None)
        self.segments[block.address] = (nbytes, small, stream, pool)
        if self.history is not None:
            self.history.segment("segment_alloc", block.address, nbytes, stream, pool)
        self._next_address += nbytes
        pool.segments += 1
        self.num_device_alloc += 1
        for name, amount in (("segment", 1), ("reserved_bytes", nbytes)):
            stats = self.segment_stats[name]
            stats[0].increase(amount)
            stats[1 if small else 2].increase(amount)
        return block

    def free(self, block: Block) -> None:
        """`block`'s tensor died: the block goes back to its free list, merged with its free
        neighbours."""
        block.allocated = False
        if self.history is not None:
            self.history.free(block)
        mine, other = self._pairs[block.small]
        current = mine.current
        current[0] -= 1
        current[1] -= block.size
        current[2] -= block.requested
        free_list = block.free_list
        keys, blocks = free_list.keys, free_list.blocks
        net_count = net_bytes = 0
        prev, after = block.prev, block.next
        if prev is not None and not prev.allocated:
            key = prev.size << ADDRESS_BITS | prev.address
            del keys[bisect_left(keys, key)]
            del blocks[key]
            block.address, block.size, block.prev = prev.address, block.size + prev.size, prev.prev
            if prev.prev is not None:
                prev.prev.next = block
            net_count -= 1
            net_bytes -= prev.size
        if after is not None and not after.allocated:
            key = after.size << ADDRESS_BITS | after.address
            del keys[bisect_left(keys, key)]
            del blocks[key]
            block.size, block.next = block.size + after.size, after.next
            if after.next is not None:
                after.next.prev = block
            net_count -= 1
            net_bytes -= after.size
        key = block.size << ADDRESS_BITS | block.address
        insort(keys, key)
        blocks[key] = block
        if block.prev is not None or block.next is not None:
            net_count += 1
            net_bytes += block.size
        elif not self.caching:  # the allocator switched off: a whole free segment goes back
            self._release_segment(block.pool, free_list, block)
        if net_count or net_bytes:
            current[3] += net_count
            current[4] += net_bytes
            if net_count > 0 or net_bytes > 0:
                if net_count > 0:
                    mine.allocated[3] += net_count
                if net_bytes > 0:
                    mine.allocated[4] += net_bytes
                self._split_peaks(mine, other)

    # --- graph pools -------------------------------------------------------------------------

    def begin_allocate_to_pool(self, handle, pool_id: tuple[int, int], streams: set) -> None:
        """A capture into the pool of `handle` (CUDA's id `pool_id`) begins: allocations on
        `streams` (the set itself, which grows as streams join the capture) come from that pool
        (`capture_pool`) until it ends; the caller reads both when each allocation is made."""
        pool = self.pool_of(handle, pool_id)
        pool.use_count += 1
        self._freeable.discard(pool)
        self.capture_pool, self.capture_streams = pool, streams

    def pool_of(self, handle, pool_id: tuple[int, int]) -> Pool:
        """This device's graph pool of a graph pool handle (CUDA's id `pool_id`: a snapshot's
        `segment_pool_id`), made on first use."""
        pool = self._graph_pools.get(handle)
        if pool is None:
            pool = self._graph_pools[handle] = Pool(pool_id, self.device)
        return pool

    def share_pool(self, handle, pool: Pool) -> None:
        """Captures into `handle` allocate from `pool` and take a use of it (a capture into a
        MemPool's id: CUDA's pool of that id is the MemPool's)."""
        self._graph_pools[handle] = pool

    def new_mem_pool(self, handle, pool_id: tuple[int, int]) -> Pool:
        """A user-created pool (torch.cuda.MemPool) for `handle`, named `pool_id`, in use once (by
        its MemPool)."""
        pool = self._graph_pools[handle] = Pool(pool_id, self.device)
        pool.use_count = 1
        return pool

    def use_pool(self, pool: Pool) -> None:
        pool.use_count += 1
        self._freeable.discard(pool)

    def release(self, pool: Pool) -> None:
        """One user of `pool` is done; unused, its free segments go back on empty_cache()."""
        if pool.use_count == 0:
            raise RuntimeError(f"release of pool {pool.id}: no one uses it")
        pool.use_count -= 1
        if pool.use_count == 0:
            self._freeable.add(pool)

    def end_allocate_to_pool(self) -> None:
        self.capture_pool, self.capture_streams = None, set()

    def release_pool(self, handle) -> None:
        """A graph captured into `handle`'s pool was reset or destroyed."""
        pool = self._graph_pools.get(handle)
        if pool is None or pool.use_count == 0:
            raise RuntimeError(f"release_pool({handle!r}): no graph uses this pool")
        self.release(pool)

    # --- empty_cache and the statistics ------------------------------------------------------

    def empty_cache(self) -> None:
        """Give back every wholly free segment of the regular pool and of unused graph pools."""
        self.num_sync_all_streams += 1
        self._release_free_segments(self.regular)
        for pool in tuple(self._freeable):
            self._release_free_segments(pool)
            if pool.segments == 0:
                self._freeable.discard(pool)

    def _release_free_segments(self, pool: Pool) -> None:
        for free_list in (f for lists in pool.free_lists.values() for f in lists):
            whole = [b for b in list(free_list.blocks.values())
                     if b.prev is None and b.next is None]
            for block in whole:
                self._release_segment(pool, free_list, block)

    def _release_segment(self, pool: Pool, free_list: _FreeList, block: Block) -> None:
        """`block`, free and a whole segment, goes back to the device (cudaFree)."""
        key = block.size << ADDRESS_BITS | block.address
        del free_list.blocks[key]
        free_list.keys.remove(key)
        pool.segments -= 1
        self.num_device_free += 1
        _, _, stream, _ = self.segments.pop(block.address)
        if self.history is not None:
            self.history.segment("segment_free", block.address, block.size, stream, pool)
        for name, amount in (("segment", 1), ("reserved_bytes", block.size)):
            stats = self.segment_stats[name]
            stats[0].decrease(amount)
            stats[1 if block.small else 2].decrease(amount)

    def carry_over(self, early: EarlyCounts) -> None:
        """Take the totals and peaks counted before the model started (`early`), once the blocks
        of the storages alive then were made. The allocated and requested bytes and the counts
        are CUDA's (a block the model then takes whole can make its own bytes larger); the
        reserved bytes' peak is raised to at least the allocated peak, the one bound known for
        it (segments are not built before the model starts)."""
        for mine, before in ((self._small, early.small), (self._large, early.large)):
            for i in (0, 1, 2):
                # freed = allocated - current + base must come out as what was freed before.
                mine.base[i] = mine.current[i] - before.current[i]
                mine.allocated[i] = before.allocated[i]
                mine.peak[i] = max(mine.peak[i], before.peak[i])
        for i in (0, 1, 2):
            self._all_peak[i] = max(self._all_peak[i], early.all_peak[i])
        reserved = self.segment_stats["reserved_bytes"]
        for stat, peak in zip(reserved, (early.all_peak[1], early.small.peak[1],
                                         early.large.peak[1])):
            stat.peak = max(stat.peak, peak)

    def allocated_bytes(self) -> int:
        return self._small.current[1] + self._large.current[1]

    def stat(self, name: str, field: str) -> int:
        """`{name}.all.{field}` of memory_stats(), for a stat that memory_allocated() and friends
        read (allocated_bytes, reserved_bytes)."""
        return self._stats(name)[0][FIELDS.index(field)]

    def reset_peak(self) -> None:
        for counters in (self._small, self._large):
            counters.peak[:] = counters.current
        self._all_peak[:] = [s + l for s, l in zip(self._small.current, self._large.current)]
        for stats in self.segment_stats.values():
            for stat in stats:
                stat.reset_peak()

    def reset_accumulated(self) -> None:
        for counters in (self._small, self._large):
            counters.allocated[:] = [0] * len(HOT_STATS)
            counters.base[:] = counters.current
        for stats in self.segment_stats.values():
            for stat in stats:
                stat.reset_accumulated()
        self.num_device_alloc = self.num_device_free = self.num_sync_all_streams = 0
        self.num_ooms = 0

    def _stats(self, name: str) -> list[tuple[int, int, int, int]]:
        """(current, peak, allocated, freed) of `name` for all, small_pool, large_pool."""
        if name in self.segment_stats:
            return [(s.current, s.peak, s.allocated, s.freed) for s in self.segment_stats[name]]
        i = HOT_STATS.index(name)
        small, large = self._small, self._large
        rows = [(c.current[i], c.peak[i], c.allocated[i], c.allocated[i] - c.current[i] + c.base[i])
                for c in (small, large)]
        whole = tuple(a + b for a, b in zip(*rows))
        return [(whole[0], self._all_peak[i], whole[2], whole[3]), *rows]

    def memory_stats(self) -> "collections.OrderedDict[str, int]":
        """`torch.cuda.memory_stats()`'s keys and values, sorted by key as torch returns them.
        Active blocks are the allocated ones: no free is deferred here."""
        out: dict[str, int] = {}
        for name, source in (*((n, n) for n in HOT_STATS + SEGMENT_STATS),
                             ("active", "allocation"), ("active_bytes", "allocated_bytes")):
            for scope, values in zip(SCOPES, self._stats(source)):
                out.update({f"{name}.{scope}.{field}": v for field, v in zip(FIELDS, values)})
        for name in ("oversize_allocations", "oversize_segments"):  # none: no max_split_size
            out.update({f"{name}.{field}": 0 for field in FIELDS})
        out.update({"num_alloc_retries": 0, "num_ooms": self.num_ooms,
                    "num_sync_all_streams": self.num_sync_all_streams,
                    "num_device_alloc": self.num_device_alloc,
                    "num_device_free": self.num_device_free, "max_split_size": -1})
        return collections.OrderedDict(sorted(out.items()))


def segments_snapshot(allocator: CachingAllocator, allocated: list[Block], frames_of,
                      stream_handle, pool_id: tuple[int, int] | None) -> list[dict]:
    """`torch.cuda.memory_snapshot()`'s segments, each with its blocks in address order, as
    CUDACachingAllocator's snapshot() lays them out (`pool_id`: only that pool's segments).
    `allocated` are the blocks in use, `frames_of(block)` their recorded frames,
    `stream_handle(stream)` the int CUDA reports for a stream."""
    starts = sorted(allocator.segments)
    blocks: dict[int, list[Block]] = {start: [] for start in starts}

    def place(block: Block) -> None:
        i = bisect_left(starts, block.address + 1) - 1
        if i >= 0:
            blocks[starts[i]].append(block)

    for block in allocated:
        place(block)
    pools = {allocator.regular, *allocator._graph_pools.values(), *allocator._freeable}
    for pool in pools:
        for lists in pool.free_lists.values():
            for free_list in lists:
                for block in free_list.blocks.values():
                    place(block)
    out = []
    for start in starts:
        size, small, stream, pool = allocator.segments[start]
        if pool_id is not None and pool.id != pool_id:
            continue
        rows = []
        for block in sorted(blocks[start], key=lambda b: b.address):
            rows.append({"address": block.address, "size": block.size,
                         "requested_size": block.requested if block.allocated else 0,
                         "state": "active_allocated" if block.allocated else "inactive",
                         "frames": frames_of(block) if block.allocated else []})
        in_use = sum(r["size"] for r in rows if r["state"] == "active_allocated")
        out.append({"device": allocator.device, "address": start, "total_size": size,
                    "allocated_size": in_use, "active_size": in_use,
                    "requested_size": sum(r["requested_size"] for r in rows),
                    "stream": stream_handle(stream), "segment_type": "small" if small else "large",
                    "segment_pool_id": pool.id, "is_expandable": False, "frames": [],
                    "blocks": rows})
    return out
