"""Paged KV cache and the block allocator that hands out its blocks.

The cache has one extra block at the end, the padding sink: padded token rows write their K/V
there and padded sequences point their block tables at it, so padding never touches a block the
allocator can hand to a real sequence.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

import torch

from harness.ops.sizing import cdiv, require_positive


class OutOfBlocksError(ValueError):
    """The allocator cannot satisfy a request; the message names what was asked and what is free."""


class BlockAllocator:
    """Hands out block ids in [0, num_blocks); lowest ids first so runs are reproducible."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be at least 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks: {n}")
        if n > len(self._free):
            raise OutOfBlocksError(
                f"out of KV blocks: requested {n}, {len(self._free)} free of {self.num_blocks}"
            )
        blocks = [self._free.popleft() for _ in range(n)]
        self._used.update(blocks)
        return blocks

    def free(self, blocks: Iterable[int]) -> None:
        blocks = list(blocks)
        if len(set(blocks)) != len(blocks):
            raise ValueError(f"blocks {blocks} free a block twice: after the first free it is "
                             f"not allocated")
        for block in blocks:
            if block not in self._used:
                raise ValueError(
                    f"block {block} is not allocated (valid ids are 0..{self.num_blocks - 1}; "
                    f"a double free or a foreign id)"
                )
        for block in blocks:
            self._used.remove(block)
            self._free.append(block)


class PagedKVCache:
    """`tensor` is [layers, 2 (K, V), num_blocks + 1, block_size, kv_heads, head_dim]; block
    `num_blocks` is the padding sink, never handed out. A token's slot is block * block_size + offset."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str = "cpu") -> None:
        require_positive(num_layers=num_layers, block_size=block_size, num_kv_heads=num_kv_heads,
                         head_dim=head_dim)
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.allocator = BlockAllocator(num_blocks)
        self.tensor = torch.zeros(num_layers, 2, num_blocks + 1, block_size, num_kv_heads, head_dim,
                                  dtype=dtype, device=device)

    @property
    def pad_block(self) -> int:
        return self.num_blocks

    @property
    def pad_slot(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def dtype(self) -> torch.dtype:
        return self.tensor.dtype

    @property
    def device(self) -> torch.device:
        return self.tensor.device

    def layer(self, index: int) -> torch.Tensor:
        """View [2, num_blocks + 1, block_size, kv_heads, head_dim] of one layer (writes go through)."""
        if not 0 <= index < self.num_layers:
            raise IndexError(f"layer {index} out of range for a cache of {self.num_layers} layers")
        return self.tensor[index]

    def blocks_for(self, num_tokens: int) -> int:
        """How many blocks hold `num_tokens` tokens."""
        return cdiv(num_tokens, self.block_size)
