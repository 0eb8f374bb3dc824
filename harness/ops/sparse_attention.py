"""Block-sparse paged attention: each query head attends to `top_k` KV blocks of its sequence.

Block choice follows MoBA (arXiv 2502.13189): a block's score is q . mean(keys of the block); the
query's own block is always chosen and blocks after it never are. The chosen blocks are then
visited in order (own block first, then by score) with an online softmax whose running max, sum
and output stay in FP32 until the final cast: accumulating them in BF16 swamps small
contributions (a sum near 1 cannot grow by less than 2**-8), which `accum_dtype` lets a test show.
"""

from typing import Optional

import torch

from harness.ops.attention import check_inputs, write_kv
from harness.ops.metadata import AttentionMetadata


def select_blocks(q: torch.Tensor, kv_layer: torch.Tensor, tables: torch.Tensor,
                  positions: torch.Tensor, top_k: int) -> torch.Tensor:
    """q [T, H, D], tables [T, max_blocks] (each token's block table) -> logical block indices
    [T, KVH, H // KVH, top_k], own block first. Blocks past the own block may be picked when a
    sequence has fewer than top_k blocks; they are masked out later (all their positions are
    in the future)."""
    tokens, heads, head_dim = q.shape
    max_blocks = tables.shape[1]
    block_size, kv_heads = kv_layer.shape[2], kv_layer.shape[3]
    keys = kv_layer[0].index_select(0, tables.flatten())
    means = keys.view(tokens, max_blocks, block_size, kv_heads, head_dim).float().mean(dim=2)
    qf = q.float().view(tokens, kv_heads, heads // kv_heads, head_dim)
    scores = torch.einsum("tkgd,tbkd->tkgb", qf, means)
    block = torch.arange(max_blocks, device=q.device)[None, :]
    own = (positions // block_size)[:, None]
    scores = scores.masked_fill((block > own)[:, None, None, :], float("-inf"))
    scores = scores.masked_fill((block == own)[:, None, None, :], float("inf"))
    return scores.topk(top_k, dim=-1).indices


def block_sparse_forward(q: torch.Tensor, kv_layer: torch.Tensor, positions: torch.Tensor,
                         token_to_seq: torch.Tensor, seq_lens: torch.Tensor,
                         block_tables: torch.Tensor, scale: float, top_k: int,
                         accum_dtype: torch.dtype = torch.float32,
                         chosen: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Attention over the chosen blocks -> [T, H, D] in `accum_dtype` (the op uses FP32).
    `chosen` overrides the block choice (for tests that pin it)."""
    tokens, heads, head_dim = q.shape
    block_size, kv_heads = kv_layer.shape[2], kv_layer.shape[3]
    group = heads // kv_heads
    tables = block_tables.index_select(0, token_to_seq)
    if chosen is None:
        chosen = select_blocks(q, kv_layer, tables, positions, top_k)
    flat = kv_layer.flatten(1, 2)  # [2, slots, kv_heads, head_dim]
    offsets = torch.arange(block_size, device=q.device)
    kv_head = torch.arange(kv_heads, device=q.device)[None, :, None, None]
    limit = torch.minimum(positions, seq_lens.index_select(0, token_to_seq) - 1)
    limit = limit[:, None, None, None]  # last visible position: causal and within the sequence

    qa = q.view(tokens, kv_heads, group, head_dim).to(accum_dtype)
    running_max = torch.full((tokens, kv_heads, group), float("-inf"), dtype=accum_dtype,
                             device=q.device)
    running_sum = torch.zeros_like(running_max)
    acc = torch.zeros_like(qa)
    for j in range(top_k):
        logical = chosen[..., j]  # [T, KVH, G]
        physical = tables.gather(1, logical.flatten(1)).view_as(logical)
        slots = physical[..., None] * block_size + offsets  # [T, KVH, G, block_size]
        hidden = (logical[..., None] * block_size + offsets) > limit
        keys = flat[0][slots, kv_head].to(accum_dtype)  # [T, KVH, G, block_size, D]
        values = flat[1][slots, kv_head].to(accum_dtype).masked_fill(hidden[..., None], 0.0)
        scores = torch.einsum("tkgd,tkgcd->tkgc", qa, keys) * scale
        scores = scores.masked_fill(hidden, float("-inf"))
        new_max = torch.maximum(running_max, scores.amax(dim=-1))
        # While a row has seen nothing its max is -inf; shift by 0 so exp gives 0, not NaN.
        shift = new_max.masked_fill(new_max == float("-inf"), 0.0)
        rescale = torch.exp(running_max - shift)
        probs = torch.exp(scores - shift[..., None])
        running_sum = running_sum * rescale + probs.sum(dim=-1)
        acc = acc * rescale[..., None] + torch.einsum("tkgc,tkgcd->tkgd", probs, values)
        running_max = new_max
    out = acc / running_sum.masked_fill(running_sum == 0, 1.0)[..., None]
    return out.reshape(tokens, heads, head_dim)


def block_sparse_attention_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                kv_layer: torch.Tensor, slot_mapping: torch.Tensor,
                                positions: torch.Tensor, token_to_seq: torch.Tensor,
                                seq_lens: torch.Tensor, block_tables: torch.Tensor, scale: float,
                                top_k: int, out: torch.Tensor) -> None:
    """Write k/v into the cache at slot_mapping, then attend to top_k blocks per query head."""
    write_kv(kv_layer, k, v, slot_mapping)
    out.copy_(block_sparse_forward(q, kv_layer, positions, token_to_seq, seq_lens, block_tables,
                                   scale, top_k))


block_sparse_attention_op = torch.library.custom_op(
    "harness::block_sparse_attention", mutates_args=("kv_layer", "out"))(block_sparse_attention_impl)


@block_sparse_attention_op.register_fake
def _(q, k, v, kv_layer, slot_mapping, positions, token_to_seq, seq_lens, block_tables, scale,
      top_k, out) -> None:
    return None


def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           kv_layer: torch.Tensor, metadata: AttentionMetadata, scale: float,
                           out: torch.Tensor, top_k: int) -> torch.Tensor:
    """Same arguments as `paged_attention` plus `top_k` (static, 1..max_blocks_per_seq)."""
    check_inputs(q, k, v, kv_layer, metadata, out)
    if not 1 <= top_k <= metadata.max_blocks_per_seq:
        raise ValueError(f"top_k {top_k} must lie in [1, max_blocks_per_seq "
                         f"{metadata.max_blocks_per_seq}]")
    block_sparse_attention_op(q, k, v, kv_layer, *metadata.op_inputs(), scale, top_k, out)
    return out
