"""Random paged batches for the op tests: a cache with scattered blocks, metadata prepared for a
given batch composition, each sequence's full K/V history written into the cache for the cached
part, and the new tokens' q/k/v laid out as the ops take them."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from harness.ops import AttentionMetadata, PagedKVCache, SequenceSpan


@dataclass
class Batch:
    cache: PagedKVCache
    metadata: AttentionMetadata
    spans: list[SequenceSpan]
    q: torch.Tensor  # [num_tokens, H, D], padded rows at the tail
    k: torch.Tensor  # [num_tokens, KVH, D]
    v: torch.Tensor
    queries: list[torch.Tensor]  # per sequence, the new tokens' q
    keys: list[torch.Tensor]  # per sequence, the whole history
    values: list[torch.Tensor]

    @property
    def num_actual_tokens(self) -> int:
        return sum(span.query_len for span in self.spans)


def make_batch(lengths: list[tuple[int, int]], *, heads: int = 4, kv_heads: int = 2,
               head_dim: int = 8, block_size: int = 4, pad_tokens: int = 0, pad_seqs: int = 0,
               max_blocks_per_seq: int | None = None, seed: int = 0,
               dtype: torch.dtype = torch.bfloat16, pad_value: float = float("nan"),
               device: torch.device | str = "cpu") -> Batch:
    """lengths: (seq_len, query_len) per sequence, prefills first. Padded rows get `pad_value`."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    needed = [-(-seq_len // block_size) for seq_len, _ in lengths]
    max_blocks = max_blocks_per_seq or max(needed + [1])
    num_blocks = sum(needed) + 3  # spare blocks stay zero, so a stray read shows up
    cache = PagedKVCache(1, num_blocks, block_size, kv_heads, head_dim, dtype, device)
    # Scatter blocks so that a table is not just 0, 1, 2, ...
    blocks = cache.allocator.allocate(num_blocks)
    rng.shuffle(blocks)
    metadata = AttentionMetadata(len(lengths) + pad_seqs, sum(q for _, q in lengths) + pad_tokens,
                                 max_blocks, block_size, cache.pad_slot, device)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)

    spans, queries, keys, values = [], [], [], []
    for (seq_len, query_len), count in zip(lengths, needed):
        table, blocks = blocks[:count], blocks[count:]
        spans.append(SequenceSpan(seq_len, query_len, table))
        queries.append(randn(query_len, heads, head_dim))
        keys.append(randn(seq_len, kv_heads, head_dim))
        values.append(randn(seq_len, kv_heads, head_dim))
        flat = cache.layer(0).flatten(1, 2)
        for pos in range(seq_len - query_len):  # the cached prefix, written as earlier steps did
            slot = table[pos // block_size] * block_size + pos % block_size
            flat[0, slot], flat[1, slot] = keys[-1][pos], values[-1][pos]
    metadata.prepare(spans, num_tokens=metadata.max_num_tokens, num_seqs=metadata.max_batch_size)

    def rows(parts: list[torch.Tensor], width: int) -> torch.Tensor:
        pad = torch.full((pad_tokens, width, head_dim), pad_value, dtype=dtype, device=device)
        return torch.cat(parts + [pad])

    new = [(k[k.shape[0] - q.shape[0]:], v[v.shape[0] - q.shape[0]:])
           for q, k, v in zip(queries, keys, values)]
    return Batch(cache, metadata, spans, rows(queries, heads), rows([k for k, _ in new], kv_heads),
                 rows([v for _, v in new], kv_heads), queries, keys, values)
