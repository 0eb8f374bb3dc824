"""The paged-decode kernel as it was before the split-sequence version (main 18cefd5), kept
verbatim for `scripts/decode_kernel_bench.py` to time the new kernel against: one program per
(token row, kv head), one page per loop iteration. Not used by the harness.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(
        q_ptr, kv_ptr, out_ptr, positions_ptr, token_to_seq_ptr, seq_lens_ptr, block_tables_ptr,
        scale,
        stride_qt, stride_qh, stride_qd,
        stride_kv, stride_kvb, stride_kvs, stride_kvh, stride_kvd,
        stride_ot, stride_oh, stride_od,
        stride_bt_seq, stride_bt_blk,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        PADDED_GROUP: tl.constexpr, PADDED_DIM: tl.constexpr, PADDED_BLOCK: tl.constexpr):
    token = tl.program_id(0)
    kv_head = tl.program_id(1)
    position = tl.load(positions_ptr + token)
    seq = tl.load(token_to_seq_ptr + token)
    # Causal (c <= position) and in the sequence (c < its length): a padded row sees nothing.
    limit = tl.minimum(position + 1, tl.load(seq_lens_ptr + seq).to(position.dtype))

    g = tl.arange(0, PADDED_GROUP)
    d = tl.arange(0, PADDED_DIM)
    n = tl.arange(0, PADDED_BLOCK)
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    heads = kv_head * GROUP + g
    q_mask = g_ok[:, None] & d_ok[None, :] & (limit > 0)
    q = tl.load(q_ptr + token * stride_qt + heads[:, None] * stride_qh + d[None, :] * stride_qd,
                mask=q_mask, other=0.0).to(tl.float32)

    running_max = tl.full((PADDED_GROUP,), float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros((PADDED_GROUP,), dtype=tl.float32)
    acc = tl.zeros((PADDED_GROUP, PADDED_DIM), dtype=tl.float32)
    table = block_tables_ptr + seq * stride_bt_seq
    head_base = kv_ptr + kv_head * stride_kvh
    num_blocks = tl.cdiv(limit, BLOCK_SIZE)
    for j in range(0, num_blocks):
        block = tl.load(table + j * stride_bt_blk)
        context = j * BLOCK_SIZE + n
        visible = (n < BLOCK_SIZE) & (context < limit)
        kv_mask = visible[:, None] & d_ok[None, :]
        offsets = block * stride_kvb + n[:, None] * stride_kvs + d[None, :] * stride_kvd
        # Hidden slots load as 0 (never read): stale or NaN cache entries stay out of the sums.
        k = tl.load(head_base + offsets, mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(head_base + stride_kv + offsets, mask=kv_mask, other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale
        # The torch path rounds its scores to the model dtype before the softmax; so does this.
        scores = scores.to(out_ptr.dtype.element_ty).to(tl.float32)
        scores = tl.where(visible[None, :], scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        # Padded group rows (g >= GROUP) have every score at -inf: keep their max finite so the
        # rescale below is exp(0), not exp(nan).
        new_max = tl.where(g_ok, new_max, 0.0)
        rescale = tl.exp(running_max - new_max)
        probs = tl.exp(scores - new_max[:, None])
        running_sum = running_sum * rescale + tl.sum(probs, axis=1)
        acc = acc * rescale[:, None] + tl.sum(probs[:, :, None] * v[None, :, :], axis=1)
        running_max = new_max

    result = acc / tl.maximum(running_sum, 1e-30)[:, None]
    tl.store(out_ptr + token * stride_ot + heads[:, None] * stride_oh + d[None, :] * stride_od,
             result.to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])


def _padded(n: int) -> int:
    return triton.next_power_of_2(n)


def paged_decode_triton(q: torch.Tensor, kv_layer: torch.Tensor, positions: torch.Tensor,
                        token_to_seq: torch.Tensor, seq_lens: torch.Tensor,
                        block_tables: torch.Tensor, scale: float, out: torch.Tensor) -> None:
    """out[t] = attention of q[t] over the cached K/V its sequence shows it: q/out [T, H, D],
    kv_layer [2, blocks, block_size, KVH, D]; positions/token_to_seq [T], seq_lens [seqs],
    block_tables [seqs, max_blocks]. The cache must already hold each token's own K/V."""
    tokens, heads, head_dim = q.shape
    _, _, block_size, kv_heads, _ = kv_layer.shape
    group = heads // kv_heads
    if tokens == 0:
        return
    _paged_decode_kernel[(tokens, kv_heads)](
        q, kv_layer, out, positions, token_to_seq, seq_lens, block_tables, scale,
        *q.stride(), *kv_layer.stride(), *out.stride(), *block_tables.stride(),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        PADDED_GROUP=_padded(group), PADDED_DIM=_padded(head_dim), PADDED_BLOCK=_padded(block_size))
