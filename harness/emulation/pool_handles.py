"""CUDA's graph pool ids for the emulator's pools.

On CUDA a pool is named by a `MempoolId_t`, an `(int, int)` tuple: `graph_pool_handle()` hands out
`(0, n)` (a pool a user asked for) and a graph captured without one gets `(n, 0)`, which its
`pool()` returns; code passes these around, compares them and uses them as dict keys. The emulator
keeps each pool as a `PoolArena`; this table maps the ids to arenas. An arena lives as long as a
graph captured into it (CUDA frees a private pool when no graph uses it); an id handed out and not
yet used gets its arena at its first capture.

CUDA's allocator keeps a pool whose graphs are all gone (use count 0) until a release of cached
memory (`empty_cache()`, which `torch.cuda.graph` calls before each capture) finds all of its
memory free and erases it; a capture naming the pool before then fails the allocator's internal
assert `use_count > 0` in capture_begin. With `refuses_released_pools` (the emulated device) the
table keeps such an arena until that release and refuses a capture into it in CUDA's words.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass
from typing import Callable

import torch

from harness.graphs.emulator.cuda_errors import RELEASED_POOL, cuda_first
from harness.graphs.emulator.pool import PoolArena


def released_pool_message(handle: tuple[int, int], live_blocks: int) -> str:
    """CUDA's text, then the harness's detail, for a capture into the released pool `handle`."""
    held = (f"{live_blocks} block(s) of it still alive (tensors its captures allocated), so "
            f"empty_cache() cannot free it" if live_blocks else
            "no empty_cache() since (torch.cuda.graph() calls it; capture_begin() does not)")
    return cuda_first(RELEASED_POOL,
                      f"capture into pool {handle!r}: every graph captured into it was reset or "
                      f"destroyed, and CUDA's caching allocator keeps a pool no graph uses until a "
                      f"release of cached memory finds all of it free; {held}. Take a fresh id "
                      f"from torch.cuda.graph_pool_handle() (or let the capture make its own pool) "
                      f"once the graphs sharing a pool are gone, or keep one of them alive while "
                      f"the pool is shared")


@dataclass(frozen=True)
class RetainedPool:
    """A use of a MemPool's pool that a graph holds until it is reset or destroyed: torch 2.14's
    `use_mem_pool(pool)` inside a capture (CUDAGraph::_retain_pool), beside its own pool's use.
    `pool_id` is CUDA's id, `model_pool` the allocator model's pool it names."""

    pool_id: tuple[int, int]
    model_pool: object


class PoolHandles:
    """The pool ids of one device (the emulated one, or the sanitizer's GPU)."""

    def __init__(self, storage_device: torch.device, *, cached: bool = False,
                 new_arena: Callable[[tuple[int, int]], PoolArena] | None = None,
                 new_user_handle: Callable[[], tuple[int, int]] | None = None,
                 new_graph_handle: Callable[[], tuple[int, int]] | None = None,
                 refuses_released_pools: bool = False) -> None:
        self._device = storage_device
        self._cached = cached  # see PoolUse: unused pools keep their memory until release_cached()
        # The arena of a pool id (default: the emulator's own segments), and the ids
        # graph_pool_handle() hands out (default: a counter of this table's).
        self._new_arena = new_arena or (lambda _: PoolArena(storage_device, cached=cached))
        self._new_user_handle = new_user_handle
        # The id of a graph's own pool (default: `(n, 0)` from a counter of this table's, CUDA's
        # shape).
        self._new_graph_handle = new_graph_handle
        # Every pool's use, also of an arena already collected: its blocks and the graphs reading
        # them keep its token and its segments (external.py).
        self._uses: weakref.WeakSet = weakref.WeakSet()
        self._user_ids = itertools.count(1)
        self._graph_ids = itertools.count(1)
        self._arenas: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        # Every pool until a release of cached memory erases it (see the module docstring).
        self._refuses_released = refuses_released_pools
        self._kept: dict[tuple[int, int], PoolArena] = {}
        # The ids of live torch.cuda.MemPools (each holds a use of its pool while it lives), with
        # the allocator model's pool of each, which a capture into the id allocates from.
        self._mem_pools: dict[tuple[int, int], object] = {}

    def user_handle(self) -> tuple[int, int]:
        """What `torch.cuda.graph_pool_handle()` returns."""
        if self._new_user_handle is not None:
            return self._new_user_handle()
        return (0, next(self._user_ids))

    def mem_pool_made(self) -> tuple[int, int]:
        """The id of a new torch.cuda.MemPool (CUDA's one counter of user-created ids); the pool
        counts as in use until `mem_pool_gone`."""
        handle = self.user_handle()
        self._mem_pools[handle] = None
        return handle

    def mem_pool_modelled(self, handle: tuple[int, int], model_pool: object) -> None:
        """The allocator model's pool of the MemPool `handle` names."""
        self._mem_pools[handle] = model_pool

    def mem_pool_model(self, handle: tuple[int, int]) -> object | None:
        """The allocator model's pool of the live MemPool `handle` names, or None."""
        return self._mem_pools.get(handle)

    def mem_pool_gone(self, handle: tuple[int, int]) -> None:
        self._mem_pools.pop(handle, None)

    def mem_pool_of(self, arena: PoolArena) -> object | None:
        """The model's pool of the live MemPool whose id `arena` was made for, or None."""
        for handle, model_pool in self._mem_pools.items():
            if self._arenas.get(handle) is arena:
                return model_pool
        return None

    def id_of(self, arena: PoolArena) -> tuple[int, int]:
        """The id `arena` was made for (what a snapshot lists as its segments' pool id)."""
        for handle, known in self._arenas.items():
            if known is arena:
                return handle
        raise KeyError(f"no pool id names the arena {arena!r}: take it from arena()")

    def _unused(self, handle: tuple[int, int], arena: PoolArena) -> bool:
        return not arena.token.in_use() and handle not in self._mem_pools

    def arena(self, handle) -> tuple[tuple[int, int], PoolArena]:
        """(the id, its arena) for a capture given `handle` (None: a pool of the graph's own)."""
        if handle is None:
            handle = (self._new_graph_handle() if self._new_graph_handle is not None
                      else (next(self._graph_ids), 0))
        elif not (type(handle) is tuple and len(handle) == 2
                  and all(type(i) is int and i >= 0 for i in handle) and any(handle)):
            raise TypeError(f"pool must be a pool id from torch.cuda.graph_pool_handle() or another "
                            f"graph's pool(): a tuple of two ints, not both 0; got {handle!r}")
        arena = self._arenas.get(handle)
        if arena is not None and self._refuses_released and self._unused(handle, arena):
            raise RuntimeError(released_pool_message(handle, arena.live_blocks()))
        if arena is None:
            arena = self._arenas[handle] = self._new_arena(handle)
            self._uses.add(arena.token)
            if self._refuses_released:
                self._kept[handle] = arena
        return handle, arena

    def existing(self, handle: tuple[int, int]) -> PoolArena | None:
        """The arena of pool id `handle` if a capture or a routing made one, else None."""
        return self._arenas.get(handle)

    def release_cached(self) -> None:
        """`empty_cache()`: the pools no graph holds give their memory back."""
        for use in list(self._uses):
            use.release_cached()
        for handle, arena in list(self._kept.items()):
            if self._unused(handle, arena) and arena.live_blocks() == 0:
                del self._kept[handle]  # CUDA erases the pool: its id names a fresh one
                self._arenas.pop(handle, None)
