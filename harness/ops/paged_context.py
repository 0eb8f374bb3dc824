"""Paged attention in torch ops: what each token of a batch attends to (`ContextPlan`), the K/V
write into the cache, the gather of every token's context, and the dense attention over it.
`paged_attention_impl` is the whole computation; `harness::paged_attention` (attention.py) wraps
it as a custom op, and `harness::paged_decode_attention` (decode_attention.py) runs it as its CPU
path.

What each token reads and sees (`ContextPlan`: its blocks, its visible positions) depends only on
the batch, not on the layer: a model computes it once per forward (`context_plan`) and hands it to
every layer's op; without one the op computes it itself.

Numerics follow transformers' eager Llama attention: scores and the weighted sum are GEMMs in the
model dtype with fp32 accumulation (the scale applied to the accumulator), the softmax accumulates in fp32 and is
rounded to the model dtype.

Masking uses `masked_fill`, not an additive mask: padded rows carry arbitrary (even NaN) q/k/v and
the pad sink holds whatever they wrote, and NaN + -inf is still NaN. For the same reason hidden
values are zeroed before the weighted sum (0 * NaN is NaN).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class ContextPlan:
    """What every token of a batch attends to, the same for every layer.

    - `blocks` [tokens, max_blocks_per_seq] int64: the KV blocks of each token's sequence, in order
      (entries past the sequence are the pad block).
    - `hidden` [tokens, max_blocks_per_seq * block_size] bool: context position c is visible to a
      token iff c <= its position (causal) and c < its sequence's length (all hidden for padded
      tokens, whose sequence has length 0); `hidden` marks the others, as the masks take it.
    """

    blocks: torch.Tensor
    hidden: torch.Tensor


def context_plan(positions: torch.Tensor, token_to_seq: torch.Tensor, seq_lens: torch.Tensor,
                 block_tables: torch.Tensor, block_size: int) -> ContextPlan:
    """The plan of a batch from its metadata rows (cut to its padded token rows)."""
    blocks = block_tables.index_select(0, token_to_seq)
    context = torch.arange(blocks.shape[1] * block_size, device=positions.device)
    # A real token's position is below its sequence's length, so c <= position covers both rules
    # there; a padded token (length 0) must see nothing.
    limit = torch.minimum(positions + 1, seq_lens.index_select(0, token_to_seq))
    return ContextPlan(blocks=blocks, hidden=context[None, :] >= limit[:, None])


def write_kv(kv_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store each token's K/V at its slot; padded tokens all land in the pad sink."""
    flat = kv_layer.flatten(1, 2)  # [2, slots, kv_heads, head_dim], a view: writes reach the cache
    pair = kv_pair(k, v)
    if pair is not None:
        flat.index_copy_(1, slot_mapping, pair)
    else:
        flat[0].index_copy_(0, slot_mapping, k)
        flat[1].index_copy_(0, slot_mapping, v)


def kv_pair(k: torch.Tensor, v: torch.Tensor) -> Optional[torch.Tensor]:
    """k and v as one [2, tokens, kv_heads, head_dim] view when both are views of one storage with
    the same shape and strides and v lies after k (the fused projection's output), else None: then
    the cache takes both in one copy, one kernel per layer fewer on CUDA."""
    if (k.shape != v.shape or k.stride() != v.stride() or k.dtype != v.dtype
            or k.device != v.device or v.storage_offset() < k.storage_offset()
            or k.untyped_storage().data_ptr() != v.untyped_storage().data_ptr()):
        return None
    return k.as_strided((2, *k.shape), (v.storage_offset() - k.storage_offset(), *k.stride()),
                        k.storage_offset())


def gather_context(kv_layer: torch.Tensor, blocks: torch.Tensor,
                   scratch: Optional[torch.Tensor]) -> torch.Tensor:
    """K/V of every token's context, [2, kv_heads, tokens, context, head_dim], in one gather.

    The gather reads the cache through a head-major view, so its output is already laid out for
    batched GEMMs over (kv head, token) without another copy."""
    _, num_blocks, block_size, kv_heads, head_dim = kv_layer.shape
    tokens, max_blocks = blocks.shape
    head_major = kv_layer.permute(0, 3, 1, 2, 4)  # [2, kv_heads, blocks, block_size, head_dim]
    if scratch is None:
        context = head_major.index_select(2, blocks.flatten())
    else:
        context = torch.index_select(head_major, 2, blocks.flatten(), out=scratch.view(
            2, kv_heads, tokens * max_blocks, block_size, head_dim))
    return context.view(2, kv_heads, tokens, max_blocks * block_size, head_dim)


def dense_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    hidden: torch.Tensor, scale: float) -> torch.Tensor:
    """q [T, H, D], keys/values [KVH, T, C, D], hidden [T, C] -> [KVH, T, H // KVH, D] in q's
    dtype; query head h reads kv head h // (H // KVH), as transformers' repeat_kv does. Rows that
    see nothing get 0. `values` is zeroed in place where hidden (it is the caller's gather)."""
    tokens, heads, head_dim = q.shape
    kv_heads = keys.shape[0]
    group = heads // kv_heads
    # [KVH * T, G, D] and [KVH * T, D, C] for one batched GEMM (q is made contiguous: one small copy),
    # which applies the scale to the fp32 accumulator, before the one rounding of the scores.
    qb = q.view(tokens, kv_heads, group, head_dim).transpose(0, 1).reshape(-1, group, head_dim)
    kb = keys.reshape(-1, keys.shape[2], head_dim).transpose(-1, -2)
    unused = torch.empty((), dtype=q.dtype, device=q.device).expand(qb.shape[0], group, kb.shape[2])
    scores = torch.baddbmm(unused, qb, kb, beta=0, alpha=scale).view(kv_heads, tokens, group, -1)
    # The lowest finite value, not -inf: a row that sees nothing then softmaxes to a uniform row
    # (not NaN) over values zeroed below, so it comes out 0 without masking the probabilities too.
    scores.masked_fill_(hidden[None, :, None, :], torch.finfo(scores.dtype).min)
    # A bf16 softmax accumulates in fp32: transformers' fp32 softmax rounded to bf16.
    probs = torch.softmax(scores, dim=-1)
    values.masked_fill_(hidden[None, :, :, None], 0.0)
    return torch.matmul(probs, values)


def paged_attention_impl(q: torch.Tensor, k: Optional[torch.Tensor], v: Optional[torch.Tensor],
                         kv_layer: torch.Tensor, slot_mapping: torch.Tensor,
                         positions: torch.Tensor, token_to_seq: torch.Tensor,
                         seq_lens: torch.Tensor, block_tables: torch.Tensor, scale: float,
                         out: torch.Tensor, scratch: Optional[torch.Tensor],
                         plan_blocks: Optional[torch.Tensor] = None,
                         plan_hidden: Optional[torch.Tensor] = None) -> None:
    """Write k/v into the cache at slot_mapping, then out = softmax(q K^T * scale) V over each
    token's visible context. `scratch`, when given, holds the gathered K/V [2, KVH, T, C, D];
    `plan_blocks`/`plan_hidden` (a `ContextPlan`), when given, spare recomputing it. k = v = None:
    the cache already holds this batch's K/V (`harness::rope_kv_write` wrote it)."""
    if k is not None and v is not None:
        write_kv(kv_layer, k, v, slot_mapping)
    if plan_blocks is None or plan_hidden is None:
        plan = context_plan(positions, token_to_seq, seq_lens, block_tables, kv_layer.shape[2])
        plan_blocks, plan_hidden = plan.blocks, plan.hidden
    context = gather_context(kv_layer, plan_blocks, scratch)
    attended = dense_attention(q, context[0], context[1], plan_hidden, scale)  # [KVH, T, G, D]
    tokens, heads, head_dim = q.shape
    out.view(tokens, attended.shape[0], attended.shape[2], head_dim).copy_(attended.transpose(0, 1))
