"""Block-sparse attention: block choice, agreement with a dense float64 reference restricted to
the chosen blocks, padding, and why it accumulates in FP32.

Tolerance everywhere: 2 bf16 steps at the output magnitude (the largest |value| of each
(token, head) row of the float64 reference)."""

from __future__ import annotations

import pytest
import torch

from harness.ops import block_sparse_attention, paged_attention
from harness.ops.sparse_attention import block_sparse_forward, select_blocks
from suites.ops.batches import Batch, make_batch
from suites.ops.reference import bf16_tolerance, naive_attention

SCALE = 0.35


def run(batch: Batch, top_k: int) -> torch.Tensor:
    out = torch.full_like(batch.q, 7.0)
    return block_sparse_attention(batch.q, batch.k, batch.v, batch.cache.layer(0), batch.metadata,
                                  SCALE, out, top_k)


def chosen_blocks(batch: Batch, top_k: int) -> torch.Tensor:
    """[T, H, top_k] logical blocks, computed on the cache after the op wrote the new K/V."""
    md = batch.metadata
    tables = md.block_tables.index_select(0, md.token_to_seq[: md.num_tokens])
    chosen = select_blocks(batch.q, batch.cache.layer(0), tables, md.input_positions(), top_k)
    return chosen.flatten(1, 2)


def restricted_reference(batch: Batch, top_k: int) -> torch.Tensor:
    chosen = chosen_blocks(batch, top_k)
    per_seq, start = [], 0
    for q in batch.queries:
        per_seq.append(chosen[start: start + q.shape[0]])
        start += q.shape[0]
    return naive_attention(batch.queries, batch.keys, batch.values, SCALE, per_seq,
                           batch.cache.block_size)


def within_tolerance(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Worst error as a multiple of the 2-step tolerance (<= 1 passes)."""
    return ((actual.cpu().double() - expected).abs() / bf16_tolerance(expected)).max().item()


@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("block_size,heads,kv_heads", [(2, 4, 2), (3, 4, 1), (4, 2, 2)])
def test_matches_dense_reference_on_chosen_blocks(top_k, block_size, heads, kv_heads) -> None:
    batch = make_batch([(11, 11), (9, 3), (13, 1), (6, 1)], block_size=block_size, heads=heads,
                       kv_heads=kv_heads, max_blocks_per_seq=7)
    out = run(batch, top_k)
    expected = restricted_reference(batch, top_k)
    assert within_tolerance(out[: batch.num_actual_tokens], expected) <= 1.0


def test_choice_takes_own_block_first_then_best_past_blocks() -> None:
    batch = make_batch([(10, 10), (17, 1)], block_size=2, heads=4, kv_heads=2)
    run(batch, 3)
    chosen = chosen_blocks(batch, 3)
    md = batch.metadata
    own = md.input_positions() // 2
    assert torch.equal(chosen[..., 0], own[:, None].expand_as(chosen[..., 0]))
    decode_row = 10  # position 16: 8 past blocks to choose from
    keys = batch.keys[1][:16].double().view(8, 2, 2, 8)  # [block, offset, kv_head, dim]
    for h in range(4):
        scores = keys.mean(1)[:, h // 2] @ batch.q[decode_row, h].double()
        best = scores.topk(2).indices
        assert torch.equal(chosen[decode_row, h, 1:], best), (h, scores)
    # A prefill token never gets a block after its own, whenever it has enough blocks before it.
    positions = md.input_positions()
    enough = positions // 2 >= 2
    assert (chosen[enough] <= own[enough, None, None]).all()


def test_choice_check_fails_on_planted_wrong_choice() -> None:
    batch = make_batch([(17, 1)], block_size=2)
    run(batch, 3)
    wrong = chosen_blocks(batch, 3).flip(-1)  # the worst of the top three first: same set
    md = batch.metadata
    out = block_sparse_forward(batch.q, batch.cache.layer(0), md.input_positions(),
                               md.token_to_seq[:1], md.seq_lens, md.block_tables, SCALE, 3,
                               chosen=wrong.view(1, 2, 2, 3))
    assert within_tolerance(out, restricted_reference(batch, 3)) <= 1.0  # order does not matter
    disjoint = torch.tensor([0, 1, 2]).expand(1, 2, 2, 3)  # not the chosen blocks
    out = block_sparse_forward(batch.q, batch.cache.layer(0), md.input_positions(),
                               md.token_to_seq[:1], md.seq_lens, md.block_tables, SCALE, 3,
                               chosen=disjoint)
    assert within_tolerance(out, restricted_reference(batch, 3)) > 1.0


def test_all_blocks_equals_dense_attention() -> None:
    lengths = [(7, 7), (10, 1), (5, 1)]
    sparse, dense = make_batch(lengths, block_size=3), make_batch(lengths, block_size=3)
    sparse_out = run(sparse, top_k=sparse.metadata.max_blocks_per_seq)
    dense_out = paged_attention(dense.q, dense.k, dense.v, dense.cache.layer(0), dense.metadata,
                                SCALE, torch.empty_like(dense.q))
    expected = naive_attention(dense.queries, dense.keys, dense.values, SCALE)
    assert within_tolerance(sparse_out, expected) <= 1.0
    assert within_tolerance(dense_out, expected) <= 1.0


def test_nan_padding_leaves_real_rows_and_slots_unchanged() -> None:
    lengths = [(9, 9), (7, 1)]
    clean, padded = make_batch(lengths), make_batch(lengths, pad_tokens=2, pad_seqs=1)
    clean_out, padded_out = run(clean, 2), run(padded, 2)
    n = clean.num_actual_tokens
    assert torch.equal(padded_out[:n], clean_out[:n])
    assert not padded_out[n:].any()
    slots = clean.cache.pad_slot
    assert torch.equal(padded.cache.layer(0).flatten(1, 2)[:, :slots],
                       clean.cache.layer(0).flatten(1, 2)[:, :slots])


def swamping_batch(blocks: int = 16, block_size: int = 4) -> Batch:
    """One decode query at the last position. Its own block holds a key it matches strongly
    (weight ~1, value +1); each of the other blocks adds weight ~2**-9 with value -1. Every such
    addition to a sum near 1 is below half a bf16 step (2**-8), so BF16 accumulation drops it."""
    seq_len = blocks * block_size
    batch = make_batch([(seq_len, 1)], heads=1, kv_heads=1, head_dim=8, block_size=block_size)
    flat = batch.cache.layer(0).flatten(1, 2)
    table = batch.spans[0].block_table
    q = torch.zeros(8)
    q[0] = 1.0
    batch.q[0, 0] = q
    logit_small = torch.log(torch.tensor(2.0 ** -9 / block_size)).item() / SCALE
    keys = torch.zeros(seq_len, 1, 8)
    keys[:, 0, 0] = logit_small
    keys[-1, 0, 0] = 0.0  # the query's own key: logit 0 = the max, weight 1
    values = -torch.ones(seq_len, 1, 8)
    values[-1] = 1.0
    keys, values = keys.bfloat16(), values.bfloat16()
    for pos in range(seq_len - 1):
        slot = table[pos // block_size] * block_size + pos % block_size
        flat[0, slot], flat[1, slot] = keys[pos], values[pos]
    batch.k[0], batch.v[0] = keys[-1], values[-1]
    batch.keys[0], batch.values[0], batch.queries[0] = keys, values, batch.q[:1].clone()
    return batch


def test_fp32_accumulation_stays_inside_where_bf16_leaves() -> None:
    blocks = 16
    batch = swamping_batch(blocks)
    md = batch.metadata
    out = run(batch, top_k=blocks)  # also writes the query's own K/V into the cache
    expected = naive_attention(batch.queries, batch.keys, batch.values, SCALE)
    bf16 = block_sparse_forward(batch.q, batch.cache.layer(0), md.input_positions(),
                                md.token_to_seq[:1], md.seq_lens, md.block_tables, SCALE, blocks,
                                accum_dtype=torch.bfloat16)
    assert within_tolerance(out, expected) <= 1.0
    assert within_tolerance(bf16, expected) > 4.0  # well outside, not a rounding coin flip


@pytest.mark.gpu
def test_cuda_matches_dense_reference_on_chosen_blocks() -> None:
    batch = make_batch([(11, 11), (9, 3), (13, 1)], block_size=2, max_blocks_per_seq=7,
                       pad_tokens=2, pad_seqs=1, device="cuda")
    out = run(batch, 3)
    n = batch.num_actual_tokens
    assert within_tolerance(out[:n], restricted_reference(batch, 3)) <= 1.0
    assert not out[n:].any()


def test_top_k_out_of_range_raises() -> None:
    batch = make_batch([(5, 5)], max_blocks_per_seq=2)
    with pytest.raises(ValueError, match=r"top_k 3 must lie in \[1, max_blocks_per_seq 2\]"):
        run(batch, 3)
