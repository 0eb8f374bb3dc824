"""The Triton paged-decode attention kernel: one query token per row, read straight from the paged
KV cache through the block table, with an online softmax (no gathered context).

Importing this module imports triton; `harness.ops.decode_attention` imports it only where the
kernel runs (a CUDA tensor), so a CPU-only install never needs triton. Under TRITON_INTERPRET=1
(set before this module is first imported: triton reads it when the kernel is decorated) the same
launcher runs the kernel on CPU tensors, which is how the CPU suites check it.

Why two launches. At batch 1 a grid of (token rows, kv heads) is 8 programs on a GPU of 132 SMs,
each walking its whole context alone: latency, not bandwidth, sets the time. So the sequence is
split (flash-decoding): the grid is (token rows, kv heads, splits), each program attends one
contiguous run of the visible context and leaves an unnormalised partial (its running max, sum
and weighted V) in a workspace, and a second launch over (token rows, kv heads) combines a row's
partials. Where the first grid alone fills the GPU there is one split and one launch, which writes
the output itself. The split count comes from the shapes only (rows, kv heads, the block table's
width), never from the lengths, so a captured shape keeps one grid for every context up to the
table's width; each program finds its run on the device from its sequence's length, so the
splits share whatever context there is and a short one leaves the later splits idle.

Why tiles of tokens. Each loop iteration reads TILE context slots at once: their block ids in one
gather from the block table, then their K and V, so a 64-token context is one or two dependent
round trips instead of one per 16-token page. Any block size works (a slot's block is its
position // block size), a power of two or not.

The workspace (float32, partials of every (row, head, split)) is allocated per call from the
shapes; under capture that is the graph's own pool, sized the same at every replay.

Numerics: q.k accumulates in fp32 and is rounded to the model dtype after the scale, as the torch
path's scores are; the softmax and the weighted sum of V stay in fp32 (online, then combined in
fp32), rounded once at the end. A token that sees nothing (a padded row: its sequence has length
0) writes zeros without reading q or the cache, so NaN in padded rows never reaches it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from harness.ops.pdl_support import pdl_launch_options
from harness.ops.triton_pdl import pdl_launch_dependents, pdl_wait

# Programs the first launch aims for (about two per SM of an H200); fewer rows * kv heads than
# this are split along the sequence until they reach it. A constant, not the device's SM count,
# so the split (and with it the fp32 summation order) is the same on every GPU.
TARGET_PROGRAMS = 256
MAX_SPLITS = 64
TILE_TOKENS = 32


@triton.jit
def _split_run(limit, split, TILE: tl.constexpr, NUM_SPLITS: tl.constexpr):
    """The tiles [first, last) of a row's visible context that split `split` attends."""
    num_tiles = tl.cdiv(limit, TILE)
    per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    first = split * per_split
    return first, tl.minimum(first + per_split, num_tiles)


@triton.jit
def _visible_limit(positions_ptr, token_to_seq_ptr, seq_lens_ptr, token):
    position = tl.load(positions_ptr + token)
    seq = tl.load(token_to_seq_ptr + token)
    # Causal (c <= position) and in the sequence (c < its length): a padded row sees nothing.
    return seq, tl.minimum(position + 1, tl.load(seq_lens_ptr + seq).to(position.dtype))


@triton.jit
def _paged_decode_split_kernel(
        q_ptr, kv_ptr, out_ptr, part_ptr, positions_ptr, token_to_seq_ptr, seq_lens_ptr,
        block_tables_ptr, scale, num_heads,
        stride_qt, stride_qh, stride_qd,
        stride_kv, stride_kvb, stride_kvs, stride_kvh, stride_kvd,
        stride_ot, stride_oh, stride_od,
        stride_bt_seq, stride_bt_blk,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        TILE: tl.constexpr, NUM_SPLITS: tl.constexpr,
        PADDED_GROUP: tl.constexpr, PADDED_DIM: tl.constexpr, USE_PDL: tl.constexpr = False):
    token = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if USE_PDL:
        # q, the cache (the rope + KV write just filled it) and the metadata are all earlier
        # work: nothing to start on before the wait.
        pdl_wait()
        pdl_launch_dependents()
    seq, limit = _visible_limit(positions_ptr, token_to_seq_ptr, seq_lens_ptr, token)
    first, last = _split_run(limit, split, TILE, NUM_SPLITS)

    g = tl.arange(0, PADDED_GROUP)
    d = tl.arange(0, PADDED_DIM)
    n = tl.arange(0, TILE)
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    heads = kv_head * GROUP + g
    q_mask = g_ok[:, None] & d_ok[None, :] & (first < last)
    q = tl.load(q_ptr + token * stride_qt + heads[:, None] * stride_qh + d[None, :] * stride_qd,
                mask=q_mask, other=0.0).to(tl.float32)

    running_max = tl.full((PADDED_GROUP,), float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros((PADDED_GROUP,), dtype=tl.float32)
    acc = tl.zeros((PADDED_GROUP, PADDED_DIM), dtype=tl.float32)
    table = block_tables_ptr + seq * stride_bt_seq
    head_base = kv_ptr + kv_head * stride_kvh
    for tile in range(first, last):
        context = tile * TILE + n
        visible = context < limit
        # One gather of the tile's block ids, then its K/V: two dependent loads per tile.
        block = tl.load(table + (context // BLOCK_SIZE) * stride_bt_blk, mask=visible,
                        other=0).to(tl.int64)
        slot = block * stride_kvb + (context % BLOCK_SIZE) * stride_kvs
        offsets = slot[:, None] + d[None, :] * stride_kvd
        kv_mask = visible[:, None] & d_ok[None, :]
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

    if NUM_SPLITS == 1:
        result = acc / tl.maximum(running_sum, 1e-30)[:, None]
        tl.store(out_ptr + token * stride_ot + heads[:, None] * stride_oh + d[None, :] * stride_od,
                 result.to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])
    else:
        # Partials of splits with no tiles are never written: the combine skips them by the
        # same arithmetic, so whatever a reused workspace holds there is never read.
        stat = (token * num_heads + heads) * NUM_SPLITS + split
        worked = g_ok & (first < last)
        tl.store(part_ptr + stat * (HEAD_DIM + 2), running_max, mask=worked)
        tl.store(part_ptr + stat * (HEAD_DIM + 2) + 1, running_sum, mask=worked)
        tl.store(part_ptr + stat[:, None] * (HEAD_DIM + 2) + 2 + d[None, :], acc,
                 mask=worked[:, None] & d_ok[None, :])


@triton.jit
def _paged_decode_combine_kernel(
        out_ptr, part_ptr, positions_ptr, token_to_seq_ptr, seq_lens_ptr, num_heads,
        stride_ot, stride_oh, stride_od,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, TILE: tl.constexpr,
        NUM_SPLITS: tl.constexpr, PADDED_GROUP: tl.constexpr, PADDED_DIM: tl.constexpr,
        PADDED_SPLITS: tl.constexpr, USE_PDL: tl.constexpr = False):
    token = tl.program_id(0)
    kv_head = tl.program_id(1)
    if USE_PDL:
        pdl_wait()  # the partials are the split kernel's output
        pdl_launch_dependents()
    _, limit = _visible_limit(positions_ptr, token_to_seq_ptr, seq_lens_ptr, token)
    s = tl.arange(0, PADDED_SPLITS)
    first, last = _split_run(limit, s, TILE, NUM_SPLITS)
    g = tl.arange(0, PADDED_GROUP)
    d = tl.arange(0, PADDED_DIM)
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    heads = kv_head * GROUP + g
    worked = g_ok[:, None] & ((s < NUM_SPLITS) & (first < last))[None, :]
    stat = ((token * num_heads + heads[:, None]) * NUM_SPLITS + s[None, :]) * (HEAD_DIM + 2)
    split_max = tl.load(part_ptr + stat, mask=worked, other=float("-inf"))
    split_sum = tl.load(part_ptr + stat + 1, mask=worked, other=0.0)
    row_max = tl.max(split_max, axis=1)
    # A row no split worked for (a padded row, a padded group row) has max -inf: weigh by exp of
    # -inf (0), not of nan.
    row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    weight = tl.where(worked, tl.exp(split_max - row_max[:, None]), 0.0)
    total = tl.sum(split_sum * weight, axis=1)
    acc = tl.load(part_ptr + stat[:, :, None] + 2 + d[None, None, :],
                  mask=worked[:, :, None] & d_ok[None, None, :], other=0.0)
    result = tl.sum(acc * weight[:, :, None], axis=1) / tl.maximum(total, 1e-30)[:, None]
    tl.store(out_ptr + token * stride_ot + heads[:, None] * stride_oh + d[None, :] * stride_od,
             result.to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])


def _padded(n: int) -> int:
    return triton.next_power_of_2(n)


def decode_splits(tokens: int, kv_heads: int, max_context: int,
                  tile_tokens: int = TILE_TOKENS) -> int:
    """How many runs each row's context is split into: enough for TARGET_PROGRAMS programs, no
    more than the tiles of the longest context the block table can hold, at most MAX_SPLITS."""
    wanted = -(-TARGET_PROGRAMS // max(tokens * kv_heads, 1))
    tiles = -(-max_context // tile_tokens)
    return max(1, min(wanted, tiles, MAX_SPLITS))


def paged_decode_triton(q: torch.Tensor, kv_layer: torch.Tensor, positions: torch.Tensor,
                        token_to_seq: torch.Tensor, seq_lens: torch.Tensor,
                        block_tables: torch.Tensor, scale: float, out: torch.Tensor, *,
                        num_splits: int | None = None, tile_tokens: int = TILE_TOKENS,
                        pdl: bool = False) -> None:
    """out[t] = attention of q[t] over the cached K/V its sequence shows it: q/out [T, H, D],
    kv_layer [2, blocks, block_size, KVH, D]; positions/token_to_seq [T], seq_lens [seqs],
    block_tables [seqs, max_blocks]. The cache must already hold each token's own K/V.
    num_splits None chooses from the shapes (`decode_splits`); tile_tokens is the context slots
    one loop iteration reads, a power of two; `pdl`: both launches use Programmatic Dependent
    Launch (triton_pdl.py)."""
    tokens, heads, head_dim = q.shape
    _, _, block_size, kv_heads, _ = kv_layer.shape
    group = heads // kv_heads
    if tile_tokens < 1 or tile_tokens & (tile_tokens - 1):
        raise ValueError(f"tile_tokens must be a power of two >= 1, got {tile_tokens}")
    if num_splits is None:
        num_splits = decode_splits(tokens, kv_heads, block_tables.shape[1] * block_size,
                                   tile_tokens)
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in 1..{MAX_SPLITS}, got {num_splits}")
    launch = pdl_launch_options(pdl)
    if tokens == 0:
        return
    # Per (row, head, split): max, sum, then head_dim weighted-V values, fp32.
    partials = (torch.empty(tokens * heads * num_splits * (head_dim + 2), dtype=torch.float32,
                            device=q.device) if num_splits > 1 else out)
    shapes = dict(GROUP=group, HEAD_DIM=head_dim, TILE=tile_tokens, NUM_SPLITS=num_splits,
                  PADDED_GROUP=_padded(group), PADDED_DIM=_padded(head_dim))
    _paged_decode_split_kernel[(tokens, kv_heads, num_splits)](
        q, kv_layer, out, partials, positions, token_to_seq, seq_lens, block_tables, scale, heads,
        *q.stride(), *kv_layer.stride(), *out.stride(), *block_tables.stride(),
        BLOCK_SIZE=block_size, **shapes, **launch)
    if num_splits > 1:
        _paged_decode_combine_kernel[(tokens, kv_heads)](
            out, partials, positions, token_to_seq, seq_lens, heads, *out.stride(),
            PADDED_SPLITS=_padded(num_splits), **shapes, **launch)
