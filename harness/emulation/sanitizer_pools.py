"""The graph sanitizer's pools: private pools of CUDA's own caching allocator.

On a GPU the sanitizer's tensors are real, so a graph's pool must be real too, or the allocator's
statistics, its segments and its address reuse stop being CUDA's: PyTorch's graph tests read
`reserved_bytes` after a capture and compare the addresses of tensors made inside one. A capture
does what `CUDAGraph::capture_begin` does with the allocator, without a driver capture: every
allocation of the capturing thread goes to the pool's private pool (`beginAllocateToPool`, here
with a thread filter where CUDA filters by the capture's streams), until the capture ends
(`endAllocateToPool`); a reset or a destroyed graph gives its use of the pool back
(`releasePool`), and an unused pool's segments go back at `empty_cache()`. Blocks freed during the
capture after `record_stream` are held by the allocator as CUDA's are while a pool is being
allocated to. What the emulator adds on top is unchanged: each block's liveness and an alias for
the replay that does not keep it alive, so a replay into freed memory raises.
"""

from __future__ import annotations

import bisect

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from harness import torch_internals
from harness.graphs.emulator.pool import BLOCK_ATTR, Block, PoolArena


class AllocatorPool(PoolArena):
    """One pool id's blocks, each a real allocation of CUDA's caching allocator (see the module
    docstring): the emulator's PoolArena interface, the allocator's placement."""

    def __init__(self, device: torch.device, pool_id: tuple[int, int]) -> None:
        super().__init__(device, cached=True)
        self.pool_id = pool_id
        self._blocks: list[Block] = []
        self._routing = False

    @property
    def num_segments(self) -> int:
        return 0  # the allocator's segments: torch.cuda.memory_snapshot() shows them per pool

    def begin_routing(self) -> None:
        """The capturing thread's allocations go to this pool from now on (CUDA's capture_begin)."""
        torch_internals.cuda_begin_allocate_current_thread_to_pool(self.device.index, self.pool_id)
        self._routing = True

    def end_routing(self) -> None:
        if self._routing:
            self._routing = False
            torch_internals.cuda_end_allocate_to_pool(self.device.index, self.pool_id)

    def release(self) -> None:
        """A graph captured into this pool is reset or gone: its use of the pool ends."""
        torch_internals.cuda_release_pool(self.device.index, self.pool_id)

    def live_blocks(self) -> int:
        self._sweep()
        return len(self._blocks)

    def owns(self, tensor: torch.Tensor) -> bool:
        block = getattr(tensor.untyped_storage(), BLOCK_ATTR, None)
        return block is not None and not block.liveness.expired() and block in self._blocks

    def allocate(self, nbytes: int, stream: object = None) -> tuple[torch.UntypedStorage, Block]:
        # `stream` is the caching allocator's business here: it places the block by stream.
        if nbytes <= 0:
            raise ValueError(f"pool allocations must be positive, got nbytes={nbytes}")
        if not self._routing:
            raise RuntimeError(f"pool {self.pool_id} allocates only during a capture into it: "
                               f"outside one CUDA's allocator would place the block elsewhere")
        storage = torch.empty(nbytes, dtype=torch.uint8, device=self.device).untyped_storage()
        address = storage.data_ptr()
        replay_storage = torch_internals.construct_storage_from_data_pointer(
            address, self.device, storage.nbytes())
        block = Block(0, address, storage.nbytes(), StorageWeakRef(storage), replay_storage,
                      self.token)
        setattr(storage, BLOCK_ATTR, block)
        self._sweep()
        bisect.insort(self._blocks, block, key=lambda b: b.offset)
        self.note_allocated(block)  # the allocator hands a freed block's address out again
        return storage, block

    def _sweep(self) -> None:
        self._blocks = [b for b in self._blocks if not b.liveness.expired()]
