"""CUDA's caching-allocator calls that PyTorch's cudagraph trees make
(`torch._inductor.cudagraph_trees`), on the emulated device's graph pools.

The trees keep every graph of a device in one private pool and manage its memory themselves. The
calls, each as torch/csrc/cuda/Module.cpp and c10/cuda/CUDACachingAllocator.cpp define it, over
the pool's arena (the bytes, graphs/emulator/pool.py) and the allocator's model (the accounting a
snapshot lists, caching_allocator.py) together:

- `_cuda_beginAllocateCurrentThreadToPool(device, id)`, `_cuda_endAllocateToPool(device, id)`,
  `_cuda_releasePool(device, id)`: this thread's allocations on `device` come from the pool
  (which takes a use, given back by releasePool). Made outside a capture (the trees' warm-ups,
  the copies of a recording's inputs), each is moved into a block of the pool's arena as it is
  made, so its bytes stay the pool's after its tensor dies: a graph that read it reads them again
  at each replay, as CUDA's graph keeps the address.
- `_cuda_getCheckpointState(device, id)`: the pool's allocated blocks now.
  `_cuda_setCheckpointPoolState(device, state, stale, storages)`: every block allocated now is
  freed (its storage no longer frees it), every block of the checkpoint is allocated again,
  owned by nothing, and each storage of `storages` (addresses of StorageImpls, what
  `StorageWeakRef.cdata` holds) whose memory starts at one of them owns that block from then on
  (it must own none before: CUDA's check, in its words).
  A block allocated now, not in the checkpoint, must belong to a storage passed as `stale`
  (CUDA's check, in its words). `_cuda_cudaCachingAllocator_raw_delete(ptr)` frees such an
  unowned block.
- `_cuda_checkPoolLiveAllocations(device, id, ptrs)`: whether the pool's allocated blocks start
  exactly at `ptrs`.
- `_has_Standard_Deleter(storage)`: whether the storage owns its allocation;
  `_free_And_Remove_DeleterFn(storage)`: its allocation freed now, the storage kept.
- `_construct_CUDA_Tensor_From_Storage_And_Metadata`, `_tensors_data_ptrs_at_indices_equal`,
  `_cuda_isHistoryEnabled`, `_cuda_get_conv_benchmark_empty_cache` and
  `_cudnn_set_conv_benchmark_empty_cache`: what they answer on CUDA (the last two keep a flag: the
  device has no cuDNN benchmark cache).

The model's blocks follow the arena's owners; its addresses are its own (a snapshot lists the
model's), so after a restore a block's model address may differ from CUDA's, its count not.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

from harness import torch_internals
from harness.emulation.cuda_streams import queue_of
from harness.graphs.emulator.pool import Block, PoolArena

# Module.cpp's check in _cuda_setCheckpointPoolState
STALE_NOT_PASSED = ("Any stale tensors which are being manually freed must be passed to set "
                    "checkpoint")
# addStorageDeleterFns' check: a storage handed a block of the checkpoint must not own one
OWNS_A_BLOCK = " Not expecting deleter function"
# An allocation routed to a graph pool outside a capture is moved into the pool's arena, its memory
# swapped for a block's (torch 2.12 and later). Without the swap (torch 2.11) the routing is
# counted in the pool, as a snapshot shows it, but the bytes stay the tensor's: torch's own trees,
# which read a routed allocation after its tensor died, do not run there (compiled_trees.py).
_CAN_MOVE_INTO_POOL = torch_internals.optional_name("storage_swap_data_ptr") is not None


@dataclass(frozen=True)
class PoolCheckpoint:
    """`_cuda_getCheckpointState`'s answer: the blocks of one pool allocated when it was taken."""

    device: int
    pool_id: tuple[int, int]
    arena: PoolArena
    blocks: tuple[Block, ...]


class PoolCheckpoints:
    """The emulated device's answers to the trees' allocator calls (module docstring)."""

    def __init__(self, state) -> None:
        self._state = state
        # unowned blocks a restored checkpoint allocated: address -> (block, its model hold)
        self._raw: dict[int, tuple[Block, Any]] = {}
        # (thread, device) -> the pool ids routed there, in order (endAllocateToPool takes one)
        self._routed: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self._holders: dict[tuple[int, tuple[int, int]], list[object]] = {}
        self.conv_benchmark_empty_cache = True

    # --- routing a thread's allocations ----------------------------------------------------

    def _arena(self, device: int, pool_id) -> PoolArena:
        handles = self._state.pool_handles
        arena = handles.existing(tuple(pool_id))
        return arena if arena is not None else handles.arena(tuple(pool_id))[1]

    def _model_pool(self, device: int, arena: PoolArena, pool_id):
        return self._state.memory.accounting(device).pool_of(arena, tuple(pool_id))

    def begin_allocate_to_pool(self, device: int, pool_id) -> None:
        memory = self._state.memory
        arena = self._arena(device, pool_id)
        pool = self._model_pool(device, arena, pool_id)
        memory.accounting(device).use_pool(pool)
        holder = _RoutingUse()
        arena.token.hold(holder)  # the arena stays in use as CUDA's pool does until releasePool
        self._holders.setdefault((device, tuple(pool_id)), []).append(holder)
        key = (threading.get_ident(), device)
        self._routed.setdefault(key, []).append(tuple(pool_id))
        memory.thread_pools[key] = pool
        if _CAN_MOVE_INTO_POOL:
            memory.thread_arenas[key] = arena

    def end_allocate_to_pool(self, device: int, pool_id) -> None:
        memory = self._state.memory
        key = (threading.get_ident(), device)
        routed = self._routed.get(key, [])
        if tuple(pool_id) in routed:
            routed.remove(tuple(pool_id))
        if routed:
            arena = self._arena(device, routed[-1])
            if _CAN_MOVE_INTO_POOL:
                memory.thread_arenas[key] = arena
            memory.thread_pools[key] = self._model_pool(device, arena, routed[-1])
        else:
            self._routed.pop(key, None)
            memory.thread_arenas.pop(key, None)
            memory.thread_pools.pop(key, None)

    def release_pool(self, device: int, pool_id) -> None:
        arena = self._arena(device, pool_id)
        self._state.memory.accounting(device).release(self._model_pool(device, arena, pool_id))
        holders = self._holders.get((device, tuple(pool_id)))
        if holders:
            arena.token.release(holders.pop())

    # --- checkpoints -------------------------------------------------------------------------

    def get_checkpoint_state(self, device: int, pool_id) -> PoolCheckpoint:
        _refuse_without_the_swap("_cuda_getCheckpointState")
        arena = self._arena(device, pool_id)
        return PoolCheckpoint(device, tuple(pool_id), arena, tuple(arena.allocated()))

    def set_checkpoint_pool_state(self, device: int, checkpoint: PoolCheckpoint,
                                  stale_storages, storages_to_add_deleters_to=()) -> None:
        _refuse_without_the_swap("_cuda_setCheckpointPoolState")
        if not isinstance(checkpoint, PoolCheckpoint):
            raise TypeError(f"_cuda_setCheckpointPoolState takes a state from "
                            f"_cuda_getCheckpointState, got {type(checkpoint).__name__}")
        memory, arena = self._state.memory, checkpoint.arena
        owning = [cdata for cdata in storages_to_add_deleters_to
                  if memory.owns_allocation(_storage(cdata))]
        kept = {id(b) for b in checkpoint.blocks}
        stale = {_storage(cdata).data_ptr() for cdata in stale_storages}
        freed = []
        for block in arena.allocated():
            owner = _owner(block)
            if owner is not None:
                memory.release_storage(owner)
            self._release_raw(block)
            block.release()
            if id(block) not in kept:
                freed.append(block.address)
        if len(stale) < len(freed):
            raise RuntimeError(STALE_NOT_PASSED)
        pool = self._model_pool(checkpoint.device, arena, checkpoint.pool_id)
        stream = torch.cuda.current_stream(checkpoint.device)
        for block in checkpoint.blocks:
            arena.hold(block)
            self._raw[block.address] = (block, memory.hold_block_in(pool, block.nbytes, stream))
        if any(_storage(cdata).data_ptr() in self._raw for cdata in owning):
            raise RuntimeError(OWNS_A_BLOCK)
        for cdata in storages_to_add_deleters_to:
            storage = _storage(cdata)
            found = self._raw.pop(storage.data_ptr(), None)
            if found is None:
                continue
            block, held = found
            memory.release_block(held)
            arena.hold(block, owner=storage)
            memory.adopt_in_pool(storage, arena, checkpoint.pool_id)

    def raw_delete(self, pointer: int) -> bool:
        """Free the unowned block at `pointer` that a restored checkpoint allocated; False when
        no such block starts there."""
        found = self._raw.pop(int(pointer), None)
        if found is None:
            return False
        block, held = found
        self._state.memory.release_block(held)
        block.release()
        return True

    def _release_raw(self, block: Block) -> None:
        found = self._raw.pop(block.address, None)
        if found is not None and found[0] is block:
            self._state.memory.release_block(found[1])

    def check_pool_live_allocations(self, device: int, pool_id, expected) -> bool:
        _refuse_without_the_swap("_cuda_checkPoolLiveAllocations")
        arena = self._state.pool_handles.existing(tuple(pool_id))
        live = [b.address for b in arena.allocated()] if arena is not None else []
        expected = {int(p) for p in expected}
        return all(p in expected for p in live) and len(live) == len(expected)

    # --- storages ----------------------------------------------------------------------------

    def has_standard_deleter(self, cdata: int) -> bool:
        return self._state.memory.owns_allocation(_storage(cdata))

    def free_and_remove_deleter(self, cdata: int) -> None:
        storage = _storage(cdata)
        self._state.memory.release_storage(storage)
        block = getattr(storage, "_harness_pool_block", None)
        if block is not None and getattr(block.liveness, "cdata", None) == cdata:
            block.release()

    def history_enabled(self) -> bool:
        return self._state.memory.accounting(torch.cuda.current_device()).history is not None


class _RoutingUse:
    """A use of a pool's arena while a thread's allocations are routed to it."""

    __slots__ = ("__weakref__",)


def _refuse_without_the_swap(name: str) -> None:
    """A pool's checkpoints and live blocks are its arena's, which routed allocations join only
    by the storage swap: refused by name on a build without it."""
    if not _CAN_MOVE_INTO_POOL:
        from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice

        raise UnsupportedOnEmulatedDevice(
            f"torch._C.{name} on the emulated CUDA device with torch {torch.__version__}: this "
            f"build lacks torch.UntypedStorage._swap_data_ptr_, which moves an allocation routed "
            f"to a graph pool into the pool's memory, so the pool's blocks cannot be checkpointed "
            f"or listed as CUDA's are (torch 2.12 or later has it)")


def _storage(cdata: int) -> torch.UntypedStorage:
    """The Python storage of the StorageImpl at `cdata` (what StorageWeakRef.cdata holds)."""
    return torch_internals.storage_from_weak_ptr(int(cdata))


def _owner(block: Block) -> torch.UntypedStorage | None:
    """The live storage whose death frees `block`, if a storage owns it."""
    cdata = getattr(block.liveness, "cdata", None)
    if cdata is None or block.liveness.expired():
        return None
    return _storage(cdata)


def stream_key(stream) -> tuple[int, int]:
    """What tells an arena's segments apart by stream (a capture's recorder keys them so)."""
    return queue_of(stream)  # a wrapper of a stream's handle allocates on that stream's queue


def tensor_from_storage_and_metadata(metadata: dict, storage: torch.UntypedStorage) -> torch.Tensor:
    """`torch._C._construct_CUDA_Tensor_From_Storage_And_Metadata`: a tensor of the metadata's
    dtype, size, stride and storage offset over `storage`."""
    with torch_internals.DisableTorchFunction(), torch_internals.DisableTorchDispatch():
        return torch.empty(0, dtype=metadata["dtype"]).set_(
            storage, metadata["storage_offset"], metadata["size"], metadata["stride"])


def tensors_data_ptrs_at_indices_equal(tensors, data_ptrs, indices) -> bool:
    """`torch._C._tensors_data_ptrs_at_indices_equal`: whether each tensor at `indices` starts at
    the data pointer of the same index."""
    return all(tensors[i].data_ptr() == data_ptrs[i] for i in indices)


def patches(state, raw_delete: Callable[[int], None]) -> list[tuple[Any, str, Any]]:
    """(torch._C, name, replacement) for each call above; `raw_delete` is the allocator tools'
    `_cuda_cudaCachingAllocator_raw_delete` (caching_allocator_alloc's blocks), which the trees'
    unowned blocks go ahead of."""
    pools = state.pool_checkpoints

    def delete(pointer: int) -> None:
        if not pools.raw_delete(pointer):
            raw_delete(pointer)

    def set_conv_benchmark_empty_cache(enable: bool) -> None:
        pools.conv_benchmark_empty_cache = bool(enable)

    private = {
        "_cuda_beginAllocateCurrentThreadToPool": pools.begin_allocate_to_pool,
        "_cuda_endAllocateToPool": pools.end_allocate_to_pool,
        "_cuda_releasePool": pools.release_pool,
        "_cuda_getCheckpointState": pools.get_checkpoint_state,
        "_cuda_setCheckpointPoolState": pools.set_checkpoint_pool_state,
        "_cuda_checkPoolLiveAllocations": pools.check_pool_live_allocations,
        "_cuda_cudaCachingAllocator_raw_delete": delete,
        "_has_Standard_Deleter": pools.has_standard_deleter,
        "_free_And_Remove_DeleterFn": pools.free_and_remove_deleter,
        "_cuda_isHistoryEnabled": pools.history_enabled,
        "_cuda_get_conv_benchmark_empty_cache": lambda: pools.conv_benchmark_empty_cache,
        "_cudnn_set_conv_benchmark_empty_cache": set_conv_benchmark_empty_cache,
        "_construct_CUDA_Tensor_From_Storage_And_Metadata": tensor_from_storage_and_metadata,
        "_tensors_data_ptrs_at_indices_equal": tensors_data_ptrs_at_indices_equal,
    }
    owner = torch_internals.torch_namespace("torch._C")
    return [(owner, name, fn) for name, fn in private.items()]
