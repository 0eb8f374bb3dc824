"""Dense paged attention as a `torch.library` custom op that writes into the caller's `out`.

One vectorized pass for prefill, decode and mixed batches: every token gathers the K/V of its
sequence through the block table (max_blocks_per_seq * block_size slots) and masks by position
(causal) and by its sequence's length (padding). No loop over sequences and no host read of
device data, so the op can be recorded inside a graph; every shape comes from the tensors.

Masking uses `masked_fill`, not additive -inf: padded rows carry arbitrary (even NaN) q/k/v and
the pad sink holds whatever they wrote, and NaN + -inf is still NaN.
"""

from typing import Optional

import torch

from harness.ops.metadata import AttentionMetadata
from harness.ops.workspace import Workspace


def write_kv(kv_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store each token's K/V at its slot; padded tokens all land in the pad sink."""
    flat = kv_layer.flatten(1, 2)  # [2, slots, kv_heads, head_dim], a view: writes reach the cache
    flat[0].index_copy_(0, slot_mapping, k)
    flat[1].index_copy_(0, slot_mapping, v)


def context_slots(kv_layer: torch.Tensor, block_tables: torch.Tensor,
                  token_to_seq: torch.Tensor) -> torch.Tensor:
    """[tokens, max_blocks_per_seq * block_size]: the slot of every context position of each
    token's sequence (positions past the sequence map into the pad block)."""
    block_size = kv_layer.shape[2]
    tables = block_tables.index_select(0, token_to_seq)
    offsets = torch.arange(block_size, device=tables.device)
    return (tables[:, :, None] * block_size + offsets).flatten(1)


def context_mask(num_context: int, positions: torch.Tensor, seq_lens: torch.Tensor,
                 token_to_seq: torch.Tensor) -> torch.Tensor:
    """[tokens, num_context] bool: position c is visible to a token iff c <= its position (causal)
    and c < its sequence's length (all False for padded tokens, whose sequence has length 0)."""
    context = torch.arange(num_context, device=positions.device)
    token_seq_lens = seq_lens.index_select(0, token_to_seq)
    return (context[None, :] <= positions[:, None]) & (context[None, :] < token_seq_lens[:, None])


def dense_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    visible: torch.Tensor, scale: float) -> torch.Tensor:
    """q [T, H, D], keys/values [T, C, KVH, D], visible [T, C] -> fp32 [T, H, D]; query head h
    reads kv head h // (H // KVH), as transformers' repeat_kv does. Rows that see nothing get 0."""
    tokens, heads, head_dim = q.shape
    kv_heads = keys.shape[2]
    qf = q.float().view(tokens, kv_heads, heads // kv_heads, head_dim)
    hidden = ~visible[:, None, None, :]
    scores = torch.einsum("tkgd,tckd->tkgc", qf, keys.float()) * scale
    probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
    probs = probs.masked_fill(hidden, 0.0)  # a row that sees nothing softmaxes to NaN
    values = values.float().masked_fill(~visible[:, :, None, None], 0.0)
    return torch.einsum("tkgc,tckd->tkgd", probs, values).reshape(tokens, heads, head_dim)


def paged_attention_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         kv_layer: torch.Tensor, slot_mapping: torch.Tensor,
                         positions: torch.Tensor, token_to_seq: torch.Tensor,
                         seq_lens: torch.Tensor, block_tables: torch.Tensor, scale: float,
                         out: torch.Tensor, scratch: Optional[torch.Tensor]) -> None:
    """Write k/v into the cache at slot_mapping, then out = softmax(q K^T * scale) V over each
    token's visible context. `scratch`, when given, holds the gathered K/V [2, T, C, KVH, D]."""
    write_kv(kv_layer, k, v, slot_mapping)
    slots = context_slots(kv_layer, block_tables, token_to_seq)
    tokens, num_context = slots.shape
    flat = kv_layer.flatten(1, 2)
    if scratch is None:
        context = flat.index_select(1, slots.flatten())
    else:
        context = torch.index_select(flat, 1, slots.flatten(), out=scratch.view(
            2, tokens * num_context, *flat.shape[2:]))
    context = context.view(2, tokens, num_context, *flat.shape[2:])
    visible = context_mask(num_context, positions, seq_lens, token_to_seq)
    out.copy_(dense_attention(q, context[0], context[1], visible, scale))


# The op wraps the plain function, which stays callable on its own (tests trace its aten ops).
paged_attention_op = torch.library.custom_op(
    "harness::paged_attention", mutates_args=("kv_layer", "out", "scratch"))(paged_attention_impl)


@paged_attention_op.register_fake
def _(q, k, v, kv_layer, slot_mapping, positions, token_to_seq, seq_lens, block_tables, scale,
      out, scratch) -> None:
    return None


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layer: torch.Tensor,
                 metadata: AttentionMetadata, out: torch.Tensor) -> None:
    """Host-side shape checks shared by the attention wrappers (shapes only: capture-safe)."""
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(f"q and k must be [tokens, heads, head_dim], got {tuple(q.shape)} and "
                         f"{tuple(k.shape)}")
    tokens, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    if tokens != metadata.num_tokens:
        raise ValueError(f"q has {tokens} token rows but the metadata was prepared for "
                         f"{metadata.num_tokens}")
    if k.shape != v.shape or k.shape != (tokens, kv_heads, head_dim):
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
    if k.dtype != kv_layer.dtype or v.dtype != kv_layer.dtype:
        raise ValueError(f"k/v dtype {k.dtype}/{v.dtype} must match the cache dtype {kv_layer.dtype}")


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layer: torch.Tensor,
                    metadata: AttentionMetadata, scale: float, out: torch.Tensor,
                    workspace: Optional[Workspace] = None) -> torch.Tensor:
    """q/out [num_tokens, heads, head_dim], k/v [num_tokens, kv_heads, head_dim] (num_tokens =
    metadata.num_tokens, padding included), kv_layer = PagedKVCache.layer(i). Returns `out`."""
    check_inputs(q, k, v, kv_layer, metadata, out)
    tokens = metadata.num_tokens
    scratch = None
    if workspace is not None:
        if workspace.dtype != kv_layer.dtype:
            raise ValueError(f"workspace dtype {workspace.dtype} must match the cache dtype "
                             f"{kv_layer.dtype}")
        context = metadata.max_blocks_per_seq * metadata.block_size
        scratch = workspace.get(2 * tokens * context * k.shape[1] * k.shape[2])
    paged_attention_op(q, k, v, kv_layer, *metadata.op_inputs(), scale, out, scratch)
    return out
