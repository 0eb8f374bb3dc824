"""Dummy decode batches for warmup and capture: `size` sequences of two tokens on KV blocks taken
from the allocator and given back afterwards, padded like any decode batch."""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

from harness.ops.metadata import SequenceSpan
from harness.ops.sizing import cdiv
from harness.runtime.decode.runner import PaddedDecodeBatch, pad_decode_batch

DUMMY_SEQ_LEN = 2  # the shortest decode: one cached token and one new


def dummy_blocks_per_seq(kv_cache) -> int:
    return cdiv(DUMMY_SEQ_LEN, kv_cache.block_size)


def buildable_sizes(kv_cache, sizes: Sequence[int]) -> list[int]:
    """The sizes whose dummy batch this rank can build with the KV blocks it has free."""
    free = kv_cache.allocator.num_free
    return [size for size in sizes if size * dummy_blocks_per_seq(kv_cache) <= free]


@contextlib.contextmanager
def dummy_batch(kv_cache, size: int) -> Iterator[PaddedDecodeBatch]:
    """`size` dummy decode sequences of two tokens, on KV blocks freed afterwards."""
    allocator = kv_cache.allocator
    per_seq = dummy_blocks_per_seq(kv_cache)
    blocks = allocator.allocate(size * per_seq)
    try:
        spans = tuple(SequenceSpan(seq_len=DUMMY_SEQ_LEN, query_len=1,
                                   block_table=tuple(blocks[i * per_seq:(i + 1) * per_seq]))
                      for i in range(size))
        yield pad_decode_batch(spans, size)
    finally:
        allocator.free(blocks)
