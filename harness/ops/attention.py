"""Dense paged attention as a `torch.library` custom op that writes into the caller's `out`.

One vectorized pass for prefill, decode and mixed batches, in the model dtype: every token gathers
the KV blocks of its sequence through the block table (max_blocks_per_seq blocks, one gather for K
and V together) and masks by position (causal) and by its sequence's length (padding). No loop over
sequences and no host read of device data, so the op can be recorded inside a graph; every shape
comes from the tensors. The computation itself, in torch ops, is paged_context.py; a decode-only
batch that asks for the Triton kernel goes to `harness::paged_decode_attention` instead
(decode_attention.py).
"""

from __future__ import annotations

from typing import Optional

import torch

from harness.ops.decode_attention import paged_decode_attention_op
from harness.ops.metadata import AttentionMetadata
# The torch-ops computation, named here too: its public names have always been this module's.
from harness.ops.paged_context import (ContextPlan, context_plan, dense_attention, gather_context,
                                       kv_pair, paged_attention_impl, write_kv)
from harness.ops.workspace import Workspace

__all__ = ["ContextPlan", "check_inputs", "context_plan", "dense_attention", "gather_context",
           "kv_pair", "metadata_plan", "paged_attention", "paged_attention_impl",
           "paged_attention_op", "write_kv"]


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
