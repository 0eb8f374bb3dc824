"""Block allocator and paged KV cache layout."""

from __future__ import annotations

import pytest
import torch

from harness.ops import BlockAllocator, OutOfBlocksError, PagedKVCache


def test_allocator_hands_out_distinct_blocks_and_takes_them_back() -> None:
    allocator = BlockAllocator(6)
    first, second = allocator.allocate(4), allocator.allocate(2)
    assert sorted(first + second) == list(range(6))
    assert allocator.num_free == 0
    allocator.free(first[:2])
    assert allocator.num_free == 2
    assert sorted(allocator.allocate(2)) == sorted(first[:2])


def test_running_out_names_requested_and_free() -> None:
    allocator = BlockAllocator(5)
    allocator.allocate(3)
    with pytest.raises(OutOfBlocksError, match="requested 4, 2 free of 5"):
        allocator.allocate(4)
    assert allocator.num_free == 2  # a refused request takes nothing


def test_out_of_blocks_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        BlockAllocator(1).allocate(2)


@pytest.mark.parametrize("blocks", [[7], [0, 0]], ids=["foreign", "double-free"])
def test_free_rejects_blocks_not_allocated(blocks: list[int]) -> None:
    allocator = BlockAllocator(4)
    allocator.allocate(1)
    with pytest.raises(ValueError, match="not allocated"):
        allocator.free(blocks)
    assert allocator.num_free == 3  # nothing was freed by the bad call


def test_cache_layout_and_pad_sink() -> None:
    cache = PagedKVCache(3, 5, 4, 2, 8, torch.bfloat16)
    assert cache.tensor.shape == (3, 2, 6, 4, 2, 8)
    assert cache.pad_block == 5 and cache.pad_slot == 20
    assert cache.pad_block not in cache.allocator.allocate(5)  # the sink is never handed out
    layer = cache.layer(1)
    assert layer.shape == (2, 6, 4, 2, 8)
    layer[0, 2, 3] = 1.0
    assert cache.tensor[1, 0, 2, 3].eq(1.0).all()  # a view: writes reach the cache
    with pytest.raises(IndexError, match="layer 3 out of range for a cache of 3 layers"):
        cache.layer(3)


def test_blocks_for_rounds_up() -> None:
    cache = PagedKVCache(1, 4, 4, 1, 2)
    assert [cache.blocks_for(n) for n in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]
