"""torch.cuda's allocator tooling on the emulated device, in the shapes CUDA's caching allocator
gives it, answered from the model of that allocator (caching_allocator.py):

- `caching_allocator_alloc(size)` / `caching_allocator_delete(ptr)`: a raw block of device memory,
  counted in the statistics as any allocation; deleting a pointer the allocator did not hand out
  raises CUDA's "invalid device pointer".
- `torch.cuda.memory._record_memory_history()` and `_snapshot()` / `memory_snapshot()`: segments
  with their blocks (address, size, requested size, state, the allocating stack's frames), and the
  trace of alloc, free_requested, free_completed, segment_alloc and segment_free entries, in a
  ring of `max_entries`. torch's own Python wrappers run; the names they call in `torch._C` are
  what is replaced. As on CUDA, the history is recorded on every device at once, each device
  keeps its own trace (`device_traces[i]`), and a snapshot lists every device's segments, each
  with its `device`.
- `torch.cuda.MemPool()` and `torch.cuda.use_mem_pool(pool)`: a user-created pool with id
  `(0, n)`, n from the counter `graph_pool_handle()` takes its ids from too, as on CUDA; the
  pool is of the device current when it is made (at::cuda::MemPool's `device_`). The current
  thread's allocations on the device `use_mem_pool` names (the current one by default) come from
  that device's pool of the id: the MemPool's own on its device, on another device a pool of the
  same id made there, as CUDA's beginAllocateCurrentThreadToPool(device, id) makes one; its blocks
  are reused by it alone, it counts in its device's statistics, and its free segments go back on
  `empty_cache()` once the MemPool is gone. On builds whose CUDAGraph retains pools (torch 2.14
  and later), `use_mem_pool` inside a capture makes the capturing graph hold a use of the pool
  until it is reset or destroyed, and list it in `pools()`. A MemPool with a custom allocator
  (`CUDAPluggableAllocator`: functions in a shared library that call cudaMalloc, or NCCL's
  `ncclMemAlloc`) is refused: that code needs a GPU.

The addresses are the model's, not the storages' `data_ptr()` (the data lives in cpu tensors).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import sys
import time
import traceback
import weakref
from typing import Any, Iterator

import torch
import torch.cuda.graphs

from harness import torch_internals

from harness.emulation.caching_allocator import Block, Pool, segments_snapshot


# Whether this build's CUDAGraph retains a pool that use_mem_pool routes to inside its capture
# (torch 2.14 and later; its Python half calls the C++ half's `_retain_pool`).
_GRAPHS_RETAIN_MEM_POOLS = hasattr(torch.cuda.graphs.CUDAGraph, "_retain_pool")


class UnsupportedOnEmulatedDevice(NotImplementedError):
    """A CUDA feature that torch on a CPU cannot provide; the message says which and why."""


def _frames() -> list[dict]:
    """The Python stack as CUDA's allocator records it (innermost first), without the emulated
    device's own frames (its modes run inside torch's override and dynamo-disable wrappers)."""
    out = []
    for frame in reversed(traceback.extract_stack()):
        path = frame.filename.replace("\\", "/")
        if any(part in path for part in _OWN_FRAMES):
            continue
        out.append({"filename": frame.filename, "line": frame.lineno, "name": frame.name})
    return out


_OWN_FRAMES = ("/harness/emulation/", "/torch/_dynamo/", "/torch/overrides.py",
               "/torch/utils/_device.py", "/torch/_compile.py")


class MemoryHistory:
    """What `_record_memory_history` keeps: the trace ring and each live block's frames."""

    def __init__(self, stream_handle, max_entries: int, trace: bool, context: bool) -> None:
        self._stream_handle = stream_handle
        self.trace: collections.deque = collections.deque(maxlen=max(1, int(max_entries))
                                                           if max_entries < sys.maxsize else None)
        self._record_trace = trace
        self._context = context
        self.frames: dict[int, list[dict]] = {}  # id(block) -> frames, while it is allocated

    def _entry(self, action: str, address: int, size: int, stream, pool_id, frames) -> None:
        if self._record_trace:
            self.trace.append({"action": action, "addr": address, "size": size,
                               "stream": self._stream_handle(stream), "frames": frames,
                               "time_us": time.time_ns() // 1000, "pool_id": pool_id,
                               "device_free": 0, "compile_context": "N/A", "user_metadata": ""})

    def alloc(self, block: Block, stream) -> None:
        frames = _frames() if self._context else []
        self.frames[id(block)] = frames
        self._entry("alloc", block.address, block.size, stream, block.pool.id, frames)

    def free(self, block: Block) -> None:
        frames = self.frames.pop(id(block), [])
        for action in ("free_requested", "free_completed"):
            self._entry(action, block.address, block.size, None, block.pool.id, frames)

    def segment(self, action: str, address: int, size: int, stream, pool: Pool) -> None:
        self._entry(action, address, size, stream, pool.id, [])


def patches(state) -> list[tuple[Any, str, Any]]:
    """(owner, attribute, replacement) for the allocator tooling (see the module docstring)."""
    memory = state.memory
    raw: dict[int, torch.Tensor] = {}  # caching_allocator_alloc's pointers -> their storage
    mem_pools: dict[tuple[int, int], Pool] = {}
    pool_keys = itertools.count(1)

    def stream_handle(stream) -> int:
        return int(getattr(stream, "cuda_stream", 0) or 0)

    def caching_allocator_alloc(size, device=None, stream=None) -> int:
        if int(size) < 0:  # the raw_alloc binding's check (TORCH_CHECK_VALUE)
            raise ValueError(f"Invalid memory size: {int(size)}")
        if device is not None:
            torch.cuda.device(device)  # an index the device lacks raises CUDA's error
        if stream is not None and not isinstance(stream, (int, torch.cuda.Stream)):
            raise TypeError("Invalid type for stream argument, must be `torch.cuda.Stream` or "
                            "`int` representing a pointer to an existing stream")
        context = torch.cuda.stream(stream) if isinstance(stream, torch.cuda.Stream) else \
            contextlib.nullcontext()
        with context:
            block = torch.empty(int(size), dtype=torch.uint8, device="cuda")
        pointer = block.data_ptr()
        raw[pointer] = block
        return pointer

    def caching_allocator_delete(mem_ptr: int) -> None:
        if raw.pop(int(mem_ptr), None) is None:
            raise RuntimeError(f"invalid device pointer: {int(mem_ptr):#x}")

    def record_memory_history(enabled="all", context="all", stacks="all",
                              max_entries=sys.maxsize, clear_history=False, *rest) -> None:
        if enabled not in (None, "state", "all"):
            raise ValueError(f"enabled={enabled!r}; accepted: None, 'state', 'all'")
        if context not in (None, "state", "alloc", "all"):
            raise ValueError(f"context={context!r}; accepted: None, 'state', 'alloc', 'all'")
        memory.accounting()  # what is pending is played outside the history
        # CUDA records on every device's allocator at once (NativeCachingAllocator::recordHistory)
        for index in range(state.properties.count):
            allocator = memory.device_allocator(index)
            old = allocator.history
            if enabled is None:
                allocator.history = None
                continue
            history = MemoryHistory(stream_handle, max_entries, enabled == "all",
                                    context is not None)
            if old is not None:
                history.frames = old.frames
                if not clear_history:
                    history.trace.extend(old.trace)
            allocator.history = history

    def record_memory_history_legacy(enabled: bool, record_context=True, trace_alloc_max_entries=1,
                                     trace_alloc_record_context=False, *rest) -> None:
        record_memory_history("all" if enabled else None,
                              "all" if record_context else None, "python",
                              trace_alloc_max_entries if trace_alloc_record_context else 1)

    def memory_snapshot(arg=None) -> dict:
        """torch._C._cuda_memorySnapshot: None, or (pool id, pool id, include_traces)."""
        pool_id, include_traces = None, True
        if isinstance(arg, (tuple, list)) and len(arg) >= 2:
            pool_id = (int(arg[0]), int(arg[1]))
            if pool_id == (0, 0):
                pool_id = None
            if len(arg) > 2:
                include_traces = bool(arg[2])
        segments: list[dict] = []
        traces: list[list] = [[] for _ in range(state.properties.count)]
        for allocator in memory.device_accountings():  # each device's segments, as CUDA lists
            history = allocator.history
            frames_of = (lambda block, h=history: h.frames.get(id(block), [])) if history else (
                lambda block: [])
            segments += segments_snapshot(allocator, memory.allocated_blocks(allocator.device),
                                          frames_of, stream_handle, pool_id)
            if history is not None and include_traces:
                traces[allocator.device] = list(history.trace)
        return {"segments": segments, "device_traces": traces,
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                       "garbage_collection_threshold": 0.0,
                                       "expandable_segments": False,
                                       "release_lock_on_cudamalloc": False,
                                       "pinned_use_host_register": False}}

    class MemPool:
        """torch.cuda.MemPool on the emulated device: a pool of the caching allocator's model."""

        def __init__(self, allocator=None, use_on_oom: bool = False, no_split: bool = False,
                     **options) -> None:
            if allocator is not None:
                raise UnsupportedOnEmulatedDevice(
                    f"torch.cuda.MemPool(allocator={type(allocator).__name__}) is not supported "
                    f"by harness.emulate_cuda(): a custom allocator's alloc and free functions "
                    f"(CUDAPluggableAllocator's shared library, NCCL's ncclMemAlloc) are device "
                    f"code that needs a GPU; MemPool() without one (CUDA's caching allocator) "
                    f"is modelled (docs/fidelity.md)")
            key = _PoolKey(next(pool_keys))
            self._key = key
            # CUDA numbers MemPools and graph_pool_handle() ids from one counter.
            pool_id = state.pool_handles.mem_pool_made()
            # the pool is made on the device current now (at::cuda::MemPool's device_)
            self._pool = memory.accounting(torch.cuda.current_device()).new_mem_pool(key, pool_id)
            state.pool_handles.mem_pool_modelled(pool_id, self._pool)
            self._use_on_oom, self._no_split = use_on_oom, no_split
            mem_pools[self._pool.id] = self._pool
            weakref.finalize(self, _release, memory, self._pool, mem_pools, key,
                             state.pool_handles)

        @property
        def id(self) -> tuple[int, int]:
            return self._pool.id

        @property
        def allocator(self):
            return None

        def use_count(self) -> int:
            return self._pool.use_count

        def snapshot(self, include_traces: bool = True) -> list[dict]:
            return torch.cuda.memory_snapshot(self.id, include_traces=include_traces)

    @contextlib.contextmanager
    def use_mem_pool(pool: MemPool, device=None) -> Iterator[None]:
        if not isinstance(pool, MemPool):
            if not hasattr(pool, "id"):  # torch's use_mem_pool reads pool.id first: its error
                raise AttributeError(f"'{type(pool).__name__}' object has no attribute 'id' "
                                     f"(use_mem_pool() takes a torch.cuda.MemPool)")
            raise TypeError(f"use_mem_pool() takes a torch.cuda.MemPool, got "
                            f"{type(pool).__name__}")
        index = state.streams.device_index(device)  # the current device for None
        torch.cuda.device(index)  # an index the device lacks raises CUDA's error
        allocator = memory.accounting(index)
        # the MemPool's own pool on its device; on another, that device's pool of the same id
        # (made there in use once by this context, as create_or_incref_pool makes it)
        target = pool._pool if pool._pool.device == index else allocator.pool_of(pool._key,
                                                                                   pool.id)
        with memory.thread_allocating_to(index, target):
            if _GRAPHS_RETAIN_MEM_POOLS and state.is_current_stream_capturing():
                # torch 2.14's use_mem_pool: the capturing graph keeps the pool until its reset
                torch.cuda.CUDAGraph.get_currently_capturing_graph()._retain_pool(pool)
            yield

    private = {
        "_cuda_cudaCachingAllocator_raw_alloc": lambda size, stream: caching_allocator_alloc(size),
        "_cuda_cudaCachingAllocator_raw_delete": lambda mem_ptr: caching_allocator_delete(mem_ptr),
        "_cuda_record_memory_history": record_memory_history,
        "_cuda_record_memory_history_legacy": record_memory_history_legacy,
        "_cuda_memorySnapshot": memory_snapshot,
        # torch.cuda.get_allocator_backend(): the model is of CUDA's default, the native caching allocator
        "_cuda_getAllocatorBackend": lambda: "native",
    }
    out = [(torch_internals.torch_namespace("torch._C"), name, fn) for name, fn in private.items()]
    for owner in (torch.cuda, torch.cuda.memory):
        out += [(owner, "caching_allocator_alloc", caching_allocator_alloc),
                (owner, "caching_allocator_delete", caching_allocator_delete),
                (owner, "MemPool", MemPool), (owner, "use_mem_pool", use_mem_pool)]
    return out


class _PoolKey:
    """What the allocator's model keys a MemPool's pool by (weakly): alive until the MemPool's
    finalizer has released the pool."""

    __slots__ = ("n", "__weakref__")

    def __init__(self, n: int) -> None:
        self.n = n


def _release(memory, pool: Pool, mem_pools: dict, key: _PoolKey, pool_handles) -> None:
    mem_pools.pop(pool.id, None)
    pool_handles.mem_pool_gone(pool.id)
    memory.device_allocator(pool.device).release(pool)
    del key  # the pool stays listed as freeable until empty_cache() gives its segments back


__all__ = ["MemoryHistory", "UnsupportedOnEmulatedDevice", "patches"]
