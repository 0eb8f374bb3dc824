"""Graphs that share one pool (`pool=a.pool()`, as runtimes capture every batch size into one) and
read each other's memory: graph B reads a tensor that graph A's capture allocated in the pool.
CUDA's rule for shared pools is that such memory holds A's values only while nothing else was
written over it: once its last tensor is dropped the block is free for the next capture into the
pool, and a replay of that capture's graph writes its own values there. Replayed in capture order
(A, B, then the later graph, each step, as vLLM's piecewise pieces are) B reads what A wrote; B
replayed after the later graph, with A not replayed in between (A reset, or replayed less often),
reads the later graph's values, silently on CUDA.

The pool (pool.py) orders writes by allocation: each block carries the mark of its last writer (its
capture, then every replay of its graph for a block that is contested), and a block B read keeps
the blocks allocated over its bytes. A replay of B is refused when one of them wrote after the
block's own graph did. In the graph sanitizer the pools are CUDA's own allocator's
(emulation/sanitizer_pools.py) and the blocks are its addresses, so the same rule holds there for
the allocations the recorder makes (not for a library's own, such as a cuBLAS workspace); real
CUDA is silent.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.graphs.base import FreedMemoryError
from harness.graphs.emulator.pool import Block, PoolArena


@dataclass(frozen=True)
class SharedBlock:
    """A block of the pool that a capture read but did not allocate."""

    block: Block
    tensor: str  # "shape (8,), torch.float32"
    first_use: str  # "file:line: source" of the reading capture's first op on it


def overwritten_error(shared: SharedBlock, newer: Block) -> FreedMemoryError:
    where = f" first read by the capture at {shared.first_use}" if shared.first_use else ""
    by = f" (allocated at {newer.allocated_at})" if newer.allocated_at else ""
    return FreedMemoryError(
        f"replay() of a graph that reads pool memory overwritten by another graph: the tensor of "
        f"{shared.tensor}{where} was allocated by an earlier capture into the same pool, its last "
        f"tensor was dropped since, and a later capture into the pool was handed its bytes{by}; "
        f"that allocation was written after the graph that allocated the tensor last wrote it "
        f"(the later graph replayed, the owner was reset or did not replay in between). On CUDA "
        f"this replay reads (or writes) the other graph's values, silently. Keep the tensor alive "
        f"as long as every graph that reads it, or replay the graphs that share the pool in the "
        f"order they were captured", op="replay")


def first_overwritten(arena: PoolArena, shared: tuple[SharedBlock, ...]) -> FreedMemoryError | None:
    """The error a replay reading `shared` raises, or None while each holds its owner's values."""
    for entry in shared:
        newer = arena.overwritten_by(entry.block)
        if newer is not None:
            return overwritten_error(entry, newer)
    return None
