"""Dense paged attention against the naive float64 reference, and its padding guarantees."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

from harness.ops import Workspace, paged_attention
from suites.ops.batches import Batch, make_batch
from suites.ops.reference import averaged_values_tolerance, bf16_tolerance, naive_attention

SCALE = 0.35


def run(batch: Batch, workspace: Workspace | None = None) -> torch.Tensor:
    out = torch.full_like(batch.q, 7.0)
    return paged_attention(batch.q, batch.k, batch.v, batch.cache.layer(0), batch.metadata, SCALE,
                           out, workspace)


def assert_matches_reference(batch: Batch, out: torch.Tensor) -> None:
    expected = naive_attention(batch.queries, batch.keys, batch.values, SCALE)
    real = out[: batch.num_actual_tokens].double()
    error = (real - expected).abs()
    # Probabilities are rounded to bf16 (transformers' rounding): a few steps of the values averaged.
    tolerance = torch.maximum(bf16_tolerance(expected), averaged_values_tolerance(batch.values, batch.queries))
    worst = (error / tolerance).max().item()
    assert worst <= 1.0, f"error reaches {worst:.2f}x the 2-bf16-step tolerance"


def assert_cache_holds_history(batch: Batch) -> None:
    flat = batch.cache.layer(0).flatten(1, 2)
    bs = batch.cache.block_size
    for span, keys, values in zip(batch.spans, batch.keys, batch.values):
        slots = [span.block_table[p // bs] * bs + p % bs for p in range(span.seq_len)]
        assert torch.equal(flat[0, slots], keys)
        assert torch.equal(flat[1, slots], values)


CASES = {
    "prefill-only": [(5, 5), (9, 9), (1, 1)],
    "decode-only": [(7, 1), (12, 1), (2, 1), (4, 1)],
    "mixed": [(6, 6), (3, 3), (10, 1), (5, 1)],
    "chunked-prefill": [(11, 4), (8, 1)],
}


@pytest.mark.parametrize("block_size", [1, 3, 4, 16], ids=lambda b: f"block{b}")
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa2", "mqa"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_naive_reference(case: str, heads: int, kv_heads: int, block_size: int) -> None:
    batch = make_batch(CASES[case], heads=heads, kv_heads=kv_heads, block_size=block_size)
    out = run(batch)
    assert_matches_reference(batch, out)
    assert_cache_holds_history(batch)


def test_reference_check_fails_on_a_wrong_scale() -> None:
    batch = make_batch(CASES["mixed"])
    out = torch.empty_like(batch.q)
    paged_attention(batch.q, batch.k, batch.v, batch.cache.layer(0), batch.metadata, SCALE * 1.05,
                    out)
    with pytest.raises(AssertionError, match="tolerance"):
        assert_matches_reference(batch, out)


def nan_padded_pair() -> tuple[Batch, Batch]:
    """The mixed batch unpadded, and with NaN in 3 padded token rows and 2 padded sequences."""
    lengths = CASES["mixed"]
    return make_batch(lengths), make_batch(lengths, pad_tokens=3, pad_seqs=2, pad_value=float("nan"))


def test_nan_padding_leaves_real_rows_unchanged() -> None:
    clean, padded = nan_padded_pair()
    clean_out, padded_out = run(clean), run(padded)
    n = clean.num_actual_tokens
    differ = (padded_out[:n] != clean_out[:n]).flatten(1).any(1)  # NaN != NaN: counts as differing
    rows = differ.nonzero().flatten().tolist()
    nan_rows = torch.isnan(padded_out[:n]).flatten(1).any(1).nonzero().flatten().tolist()
    assert not rows, (f"padded rows leaked into real rows: rows {rows} of {n} differ from the "
                      f"unpadded run (NaN in rows {nan_rows})")
    assert torch.equal(padded_out[n:], torch.zeros_like(padded_out[n:]))


def test_nan_padding_writes_only_the_pad_sink() -> None:
    clean, padded = nan_padded_pair()
    run(clean), run(padded)
    pad_slot = clean.cache.pad_slot
    clean_slots = clean.cache.layer(0).flatten(1, 2)[:, :pad_slot]
    padded_slots = padded.cache.layer(0).flatten(1, 2)[:, :pad_slot]
    changed = (padded_slots != clean_slots).flatten(2).any(2).any(0).nonzero().flatten().tolist()
    assert not changed, (f"padded rows wrote real KV slots {changed} (the last real slot is "
                         f"{pad_slot - 1}); padding must write only the pad sink at slot {pad_slot}")
    assert torch.isfinite(padded_slots).all()
    # The padded rows' NaN K/V went somewhere: into the sink, and only there.
    assert torch.isnan(padded.cache.layer(0).flatten(1, 2)[:, pad_slot]).all()


def test_padding_tokens_without_padded_sequences() -> None:
    # A token bucket pads tokens only: padded tokens still belong to a length-0 sequence.
    batch = make_batch([(6, 6), (4, 4)], pad_tokens=5)
    out = run(batch)
    assert_matches_reference(batch, out)
    assert not out[batch.num_actual_tokens:].any()


def test_workspace_scratch_gives_the_same_result_and_grows_once() -> None:
    small, large = make_batch([(5, 1)]), make_batch(CASES["mixed"])
    workspace = Workspace(torch.bfloat16)
    for batch in (small, large, small):
        expected = run(make_batch_like(batch))
        assert torch.equal(run(batch, workspace), expected)
    assert workspace.growths == 2  # the first request and the larger batch; the rerun fits


def make_batch_like(batch: Batch) -> Batch:
    return make_batch([(s.seq_len, s.query_len) for s in batch.spans])


def test_cache_whose_pad_sink_is_not_the_metadatas_is_refused() -> None:
    # Metadata sized for a cache with one more block would send padded rows into a real block.
    batch = make_batch([(5, 5)], heads=6, kv_heads=2)
    layer = batch.cache.layer(0)
    wider = torch.zeros(2, layer.shape[1] + 1, *layer.shape[2:], dtype=layer.dtype)
    for kv_layer in (wider, layer[:, 1:]):
        with pytest.raises(ValueError, match=f"pad sink at block {batch.metadata.pad_block}"):
            paged_attention(batch.q, batch.k, batch.v, kv_layer, batch.metadata, SCALE,
                            torch.empty_like(batch.q))


@pytest.mark.parametrize("mutate,match", [
    (lambda b: {"q": b.q[:-1]}, "token rows"),
    (lambda b: {"k": b.k[:, :1].repeat(1, 4, 1), "v": b.v[:, :1].repeat(1, 4, 1)},
     "not a multiple"),
    (lambda b: {"k": b.k.float(), "v": b.v.float()}, "cache dtype"),
    (lambda b: {"out": torch.empty_like(b.q).float()}, "must match q"),
])
def test_bad_inputs_raise_naming_the_mismatch(mutate, match) -> None:
    batch = make_batch([(5, 5)], heads=6, kv_heads=2)
    args = {"q": batch.q, "k": batch.k, "v": batch.v, "out": torch.empty_like(batch.q)}
    args.update(mutate(batch))
    with pytest.raises(ValueError, match=match):
        paged_attention(args["q"], args["k"], args["v"], batch.cache.layer(0), batch.metadata,
                        SCALE, args["out"])


@st.composite
def batch_compositions(draw):
    prefills = draw(st.lists(st.tuples(st.integers(1, 12), st.integers(0, 6)), max_size=3))
    decodes = draw(st.lists(st.integers(2, 14), max_size=3))
    # (new tokens, cached prefix): a prefix makes it a chunked prefill
    lengths = [(new + cached, new) for new, cached in prefills if new > 1 or cached == 0]
    lengths += [(seq_len, 1) for seq_len in decodes]
    if not lengths:  # checked after the filter: prefills of 1 new token on a prefix are dropped
        lengths = [(draw(st.integers(2, 14)), 1)]
    heads, kv_heads = draw(st.sampled_from([(2, 2), (4, 2), (4, 1)]))
    return dict(lengths=lengths, heads=heads, kv_heads=kv_heads,
                block_size=draw(st.sampled_from([1, 2, 3, 5, 8])),
                pad_tokens=draw(st.integers(0, 3)), pad_seqs=draw(st.integers(0, 2)),
                seed=draw(st.integers(0, 2**16)))


@pytest.mark.property
@given(batch_compositions())
def test_random_batches_match_reference(composition) -> None:
    batch = make_batch(**composition)
    out = run(batch)
    assert_matches_reference(batch, out)
    assert_cache_holds_history(batch)
    assert not out[batch.num_actual_tokens:].any()


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_matches_reference_and_cpu(case: str) -> None:
    on_gpu = make_batch(CASES[case], pad_tokens=2, pad_seqs=1, device="cuda")
    on_cpu = make_batch(CASES[case], pad_tokens=2, pad_seqs=1)
    gpu_out = run(on_gpu).cpu()
    cpu_out = run(on_cpu)
    assert_matches_reference(on_gpu, gpu_out)
    n = on_cpu.num_actual_tokens
    error = (gpu_out[:n].double() - cpu_out[:n].double()).abs()
    tolerance = torch.maximum(bf16_tolerance(cpu_out[:n].double()),
                              averaged_values_tolerance(on_cpu.values, on_cpu.queries))
    assert (error <= tolerance).all()
    assert not gpu_out[n:].any()
