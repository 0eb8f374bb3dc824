"""Dense paged attention as a `torch.library` custom op that writes into the caller's `out`.

One vectorized pass for prefill, decode and mixed batches, in the model dtype: every token gathers
the KV blocks of its sequence through the block table (max_blocks_per_seq blocks, one gather for K
and V together) and masks by position (causal) and by its sequence's length (padding). No loop over
sequences and no host read of device data, so the op can be recorded inside a graph; every shape
comes from the tensors.

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

from harness.ops.metadata import AttentionMetadata
from harness.ops.workspace import Workspace


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


# The op wraps the plain function, which stays callable on its own (tests trace its aten ops).
paged_attention_op = torch.library.custom_op(
    "harness::paged_attention", mutates_args=("kv_layer", "out", "scratch"))(paged_attention_impl)


@paged_attention_op.register_fake
def _(q, k, v, kv_layer, slot_mapping, positions, token_to_seq, seq_lens, block_tables, scale,
      out, scratch, plan_blocks=None, plan_hidden=None) -> None:
    return None


def check_inputs(q: torch.Tensor, k: Optional[torch.Tensor], v: Optional[torch.Tensor],
                 kv_layer: torch.Tensor, metadata: AttentionMetadata, out: torch.Tensor) -> None:
    """Host-side shape checks shared by the attention wrappers (shapes only: capture-safe).
    k = v = None: the cache already holds the batch's K/V."""
    if (k is None) != (v is None):
        raise ValueError(f"k and v must be given together, or both None (the cache already written); "
                         f"got k {'None' if k is None else tuple(k.shape)}, v "
                         f"{'None' if v is None else tuple(v.shape)}")
    if q.dim() != 3 or (k is not None and k.dim() != 3):
        raise ValueError(f"q and k must be [tokens, heads, head_dim], got {tuple(q.shape)} and "
                         f"{None if k is None else tuple(k.shape)}")
    tokens, heads, head_dim = q.shape
    kv_heads = kv_layer.shape[-2] if k is None else k.shape[1]
    if tokens != metadata.num_tokens:
        raise ValueError(f"q has {tokens} token rows but the metadata was prepared for "
                         f"{metadata.num_tokens}")
    if k is not None and (k.shape != v.shape or k.shape != (tokens, kv_heads, head_dim)):
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must both be "
                         f"[{tokens}, kv_heads, {head_dim}]")
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} kv heads")
    # The pad sink must be the cache's last block: padded rows write there, and nowhere else.
    expected = (2, metadata.pad_block + 1, metadata.block_size, kv_heads, head_dim)
    if tuple(kv_layer.shape) != expected:
        raise ValueError(f"kv_layer {tuple(kv_layer.shape)} does not match the metadata's "
                         f"{list(expected)} (2, blocks + the pad sink at block {metadata.pad_block}, "
                         f"block_size, kv_heads, head_dim)")
    if out.shape != q.shape or out.dtype != q.dtype:
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} must match q {tuple(q.shape)} {q.dtype}")
    if k is not None and (k.dtype != kv_layer.dtype or v.dtype != kv_layer.dtype):
        raise ValueError(f"k/v dtype {k.dtype}/{v.dtype} must match the cache dtype {kv_layer.dtype}")


def metadata_plan(metadata: AttentionMetadata) -> ContextPlan:
    """`context_plan` of the batch the metadata holds (its padded token rows)."""
    _, positions, token_to_seq, seq_lens, block_tables = metadata.op_inputs()
    return context_plan(positions, token_to_seq, seq_lens, block_tables, metadata.block_size)


def paged_attention(q: torch.Tensor, k: Optional[torch.Tensor], v: Optional[torch.Tensor],
                    kv_layer: torch.Tensor,
                    metadata: AttentionMetadata, scale: float, out: torch.Tensor,
                    workspace: Optional[Workspace] = None,
                    plan: Optional[ContextPlan] = None) -> torch.Tensor:
    """q/out [num_tokens, heads, head_dim], k/v [num_tokens, kv_heads, head_dim] (num_tokens =
    metadata.num_tokens, padding included), kv_layer = PagedKVCache.layer(i); `plan` from
    `metadata_plan(metadata)` when the caller shares one across layers; k = v = None when the cache
    already holds the batch's K/V (`harness::rope_kv_write` wrote it). A decode-only batch whose
    metadata asks for the Triton kernel (`metadata.uses_decode_kernel`) runs
    `harness::paged_decode_attention` instead, which needs neither the workspace nor the plan.
    Returns `out`."""
    check_inputs(q, k, v, kv_layer, metadata, out)
    if metadata.uses_decode_kernel:
        # Imported here: decode_attention builds on this module's functions.
        from harness.ops.decode_attention import paged_decode_attention_op

        paged_decode_attention_op(q, k, v, kv_layer, *metadata.op_inputs(), scale, out,
                                  metadata.pdl)
        return out
    tokens = metadata.num_tokens
    scratch = None
    if workspace is not None:
        if workspace.dtype != kv_layer.dtype:
            raise ValueError(f"workspace dtype {workspace.dtype} must match the cache dtype "
                             f"{kv_layer.dtype}")
        context = metadata.max_blocks_per_seq * metadata.block_size
        scratch = workspace.get(2 * tokens * context * kv_layer.shape[-2] * kv_layer.shape[-1])
    blocks, hidden = (None, None) if plan is None else (plan.blocks, plan.hidden)
    paged_attention_op(q, k, v, kv_layer, *metadata.op_inputs(), scale, out, scratch, blocks, hidden)
    return out
