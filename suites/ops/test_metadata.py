"""AttentionMetadata: values, padding, counts, validation, and buffers that never move."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings, strategies as st

from harness.graphs.pointers import snapshot_tensors
from torch.utils._python_dispatch import TorchDispatchMode

from harness.ops import AttentionMetadata, SequenceSpan
from harness.ops.sizing import cdiv

BS = 4
PAD_SLOT = 40  # pad block 10


def metadata() -> AttentionMetadata:
    return AttentionMetadata(max_batch_size=4, max_num_tokens=16, max_blocks_per_seq=3,
                             block_size=BS, pad_slot=PAD_SLOT)


MIXED = [SequenceSpan(5, 5, [7, 2]), SequenceSpan(6, 2, [3, 9]), SequenceSpan(9, 1, [0, 1, 4])]


def test_mixed_batch_values() -> None:
    md = metadata()
    counts = md.prepare(MIXED)
    assert md.input_positions().tolist() == [0, 1, 2, 3, 4, 4, 5, 8]
    # position p of a sequence lives at table[p // BS] * BS + p % BS
    assert md.slot_mapping[:8].tolist() == [28, 29, 30, 31, 8, 36, 37, 16]
    assert md.token_to_seq[:8].tolist() == [0, 0, 0, 0, 0, 1, 1, 2]
    assert md.seq_lens[:3].tolist() == [5, 6, 9]
    assert md.query_start_loc[:4].tolist() == [0, 5, 7, 8]
    assert md.logits_rows().tolist() == [4, 6, 7]
    assert md.block_tables[:3].tolist() == [[7, 2, 10], [3, 9, 10], [0, 1, 4]]
    assert (counts.num_tokens, counts.num_seqs, counts.num_prefills,
            counts.num_prefill_tokens, counts.num_decodes, counts.num_decode_tokens) == (8, 3, 2, 7,
                                                                                         1, 1)


def test_padding_rows_point_only_at_the_pad_sink() -> None:
    md = metadata()
    counts = md.prepare([SequenceSpan(6, 1, [3, 9]), SequenceSpan(2, 1, [5])], num_tokens=4,
                        num_seqs=4)
    assert (counts.num_tokens, counts.num_seqs, counts.num_decodes, counts.num_decode_tokens) == (
        4, 4, 4, 4)  # the host counts describe the padded shape a graph freezes
    assert (counts.num_actual_tokens, counts.num_actual_seqs) == (2, 2)
    assert md.slot_mapping[2:].eq(PAD_SLOT).all()
    assert md.positions[2:].eq(0).all()
    assert md.seq_lens[2:].eq(0).all()  # padded sequences and the permanent pad row
    assert md.block_tables[2:].eq(PAD_SLOT // BS).all()
    pad_row = md.max_batch_size
    assert md.token_to_seq[2:4].eq(pad_row).all()
    assert md.logits_rows().tolist() == [0, 1, 2, 3]  # padded sequence j <-> padded token j


def test_a_smaller_batch_resets_what_the_larger_one_left() -> None:
    md = metadata()
    md.prepare(MIXED)
    md.prepare([SequenceSpan(3, 1, [6])])
    assert md.slot_mapping[1:].eq(PAD_SLOT).all()
    assert md.seq_lens[1:].eq(0).all()
    assert md.block_tables[1:].eq(PAD_SLOT // BS).all()


def addresses(md: AttentionMetadata) -> dict[str, tuple[int, tuple[int, ...]]]:
    return {path: (rec.address, rec.shape) for path, rec in snapshot_tensors(md).items()}


PUBLIC_BUFFERS = {"seq_lens", "query_start_loc", "positions", "slot_mapping", "token_to_seq",
                  "block_tables", "logits_indices"}


def test_prepare_never_rebinds_a_buffer() -> None:
    md = metadata()
    before = addresses(md)
    assert PUBLIC_BUFFERS <= set(before)
    for spans, tokens, seqs in ((MIXED, None, None), ([SequenceSpan(2, 1, [1])], 8, 4),
                                ([SequenceSpan(12, 12, [1, 2, 3])], 16, 1), ([], 3, 2)):
        md.prepare(spans, num_tokens=tokens, num_seqs=seqs)
        assert addresses(md) == before


class OpLog(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


def test_prepare_writes_every_buffer_with_one_copy() -> None:
    md = metadata()
    with OpLog() as log:
        md.prepare(MIXED, num_tokens=10, num_seqs=4)
    device_writes = [op for op in log.ops if op not in ("lift_fresh", "view", "_to_copy")]
    assert device_writes == ["copy_"], log.ops
    assert md.seq_lens.dtype == md.query_start_loc.dtype == torch.int32
    assert all(getattr(md, name).dtype == torch.int64 for name in PUBLIC_BUFFERS - {"seq_lens", "query_start_loc"})


@pytest.mark.parametrize("spans,kwargs,match", [
    ([SequenceSpan(1, 1, [0])] * 5, {}, "5 sequences exceed max_batch_size 4"),
    ([SequenceSpan(12, 12, [0, 1, 2])] * 2, {}, "24 tokens exceed max_num_tokens 16"),
    ([SequenceSpan(3, 3, [0])], {"num_tokens": 17}, r"num_tokens 17 .*16 \(max_num_tokens\)"),
    ([SequenceSpan(3, 3, [0])], {"num_tokens": 2}, r"num_tokens 2 .*\[3 \(real tokens\)"),
    ([SequenceSpan(2, 1, [0])] * 2, {"num_seqs": 1}, r"num_seqs 1 must lie in \[2"),
    ([SequenceSpan(2, 1, [0])], {"num_seqs": 5}, r"num_seqs 5 .*4 \(max_batch_size\)"),
    ([SequenceSpan(13, 1, [0, 1, 2, 3])], {}, "4 blocks exceed max_blocks_per_seq 3"),
    ([SequenceSpan(9, 1, [0, 1])], {}, "seq_len 9 needs 3 blocks of 4, block_table has 2"),
    ([SequenceSpan(2, 3, [0])], {}, r"query_len 3 must lie in \[1, seq_len 2\]"),
    ([SequenceSpan(2, 2, [10])], {}, r"block ids \[10\] outside \[0, 9\]"),
    ([SequenceSpan(4, 1, [0]), SequenceSpan(3, 3, [1])], {}, "prefill after a decode"),
])
def test_bad_batches_raise_naming_value_and_limit(spans, kwargs, match) -> None:
    md = metadata()
    md.prepare(MIXED)
    before = md.slot_mapping.clone()
    with pytest.raises(ValueError, match=match):
        md.prepare(spans, **kwargs)
    assert torch.equal(md.slot_mapping, before) and md.num_tokens == 8  # left as it was


def test_constructor_rejects_bad_limits() -> None:
    with pytest.raises(ValueError, match="max_num_tokens must be at least 1, got 0"):
        AttentionMetadata(2, 0, 2, 4, 8)
    with pytest.raises(ValueError, match="pad_slot 6 must be the first slot of a block of 4"):
        AttentionMetadata(2, 4, 2, 4, 6)


@pytest.mark.gpu
def test_back_to_back_prepares_on_cuda_keep_the_second_batch() -> None:
    # The staging buffer is pinned and copied without blocking: the second prepare must wait for
    # the first copy before rewriting it, or the device would read a mix of the two batches.
    md = AttentionMetadata(max_batch_size=4, max_num_tokens=16, max_blocks_per_seq=3, block_size=BS,
                           pad_slot=PAD_SLOT, device="cuda")
    assert len(md.stagings) == 2 and all(staging.is_pinned() for staging in md.stagings)
    for _ in range(20):
        md.prepare(MIXED)
        md.prepare([SequenceSpan(3, 1, [6])], num_tokens=2, num_seqs=2)
    torch.cuda.synchronize()
    assert md.slot_mapping[:3].tolist() == [26, PAD_SLOT, PAD_SLOT]
    assert md.seq_lens[:3].tolist() == [3, 0, 0] and md.logits_rows().tolist() == [0, 1]


# A per-token reference for prepare, written the long way: prepare's fast forms must give exactly
# these buffers, these counts, or this error message.
def reference_prepare(limits: dict[str, int], spans: list[SequenceSpan], num_tokens: int | None,
                      num_seqs: int | None) -> dict[str, object] | str:
    max_bs, max_tokens = limits["max_batch_size"], limits["max_num_tokens"]
    blocks, bs, pad_slot = limits["max_blocks_per_seq"], limits["block_size"], limits["pad_slot"]
    pad_block, n = pad_slot // bs, len(spans)
    actual = sum(span.query_len for span in spans)
    num_tokens = actual if num_tokens is None else num_tokens
    num_seqs = n if num_seqs is None else num_seqs
    if n > max_bs:
        return f"{n} sequences exceed max_batch_size {max_bs}"
    if not n <= num_seqs <= max_bs:
        return f"num_seqs {num_seqs} must lie in [{n} (real sequences), {max_bs} (max_batch_size)]"
    if actual > max_tokens:
        return f"{actual} tokens exceed max_num_tokens {max_tokens}"
    if not actual <= num_tokens <= max_tokens:
        return (f"num_tokens {num_tokens} must lie in [{actual} (real tokens), {max_tokens} "
                f"(max_num_tokens)]")
    seen_decode = False
    for i, span in enumerate(spans):
        seq_len, query_len, table = span.seq_len, span.query_len, list(span.block_table)
        bad = [b for b in table if not 0 <= b < pad_block]
        if not 1 <= query_len <= seq_len:
            return f"sequence {i}: query_len {query_len} must lie in [1, seq_len {seq_len}]"
        if len(table) > blocks:
            return f"sequence {i}: {len(table)} blocks exceed max_blocks_per_seq {blocks}"
        if len(table) * bs < seq_len:
            return (f"sequence {i}: seq_len {seq_len} needs {cdiv(seq_len, bs)} blocks of {bs}, "
                    f"block_table has {len(table)}")
        if bad:
            return (f"sequence {i}: block ids {bad} outside [0, {pad_block - 1}] "
                    f"(block {pad_block} is the pad sink)")
        if seen_decode and not span.is_decode:
            return f"sequence {i} is a prefill after a decode: prefills come first"
        seen_decode = seen_decode or span.is_decode
    out = {"positions": [0] * max_tokens, "slot_mapping": [pad_slot] * max_tokens,
           "token_to_seq": [max_bs] * max_tokens,
           "block_tables": [[pad_block] * blocks for _ in range(max_bs + 1)],
           "seq_lens": [0] * (max_bs + 1), "query_start_loc": [actual] * (max_bs + 1),
           "logits_indices": [min(actual + j - n, max(num_tokens - 1, 0)) for j in range(max_bs)]}
    row = 0
    for i, span in enumerate(spans):
        table = list(span.block_table)
        out["block_tables"][i] = table + [pad_block] * (blocks - len(table))
        out["seq_lens"][i], out["query_start_loc"][i] = span.seq_len, row
        for position in range(span.seq_len - span.query_len, span.seq_len):
            out["positions"][row], out["token_to_seq"][row] = position, i
            out["slot_mapping"][row] = table[position // bs] * bs + position % bs
            row += 1
        out["logits_indices"][i] = row - 1
    decodes = [span for span in spans if span.is_decode]
    out["counts"] = (num_tokens, num_seqs, n - len(decodes), actual - len(decodes), actual, n)
    return out


def assert_prepare_matches_reference(limits, spans, num_tokens, num_seqs) -> None:
    md = AttentionMetadata(**limits)
    md.prepare([SequenceSpan(1, 1, [0])])  # so that a refused batch has something to leave in place
    before = md.flat.clone()
    expected = reference_prepare(limits, spans, num_tokens, num_seqs)
    if isinstance(expected, str):
        with pytest.raises(ValueError) as refused:
            md.prepare(spans, num_tokens=num_tokens, num_seqs=num_seqs)
        assert str(refused.value) == expected
        assert torch.equal(md.flat, before)
        return
    counts = md.prepare(spans, num_tokens=num_tokens, num_seqs=num_seqs)
    got = {name: getattr(md, name).tolist() for name in AttentionMetadata.BUFFERS}
    assert got == {name: expected[name] for name in AttentionMetadata.BUFFERS}
    assert (counts.num_tokens, counts.num_seqs, counts.num_prefills, counts.num_prefill_tokens,
            counts.num_actual_tokens, counts.num_actual_seqs) == expected["counts"]


@st.composite
def accepted_batches(draw):
    """Limits and a batch that fits them: prefills (some on a cached prefix), then decodes, block
    tables of any length that holds the sequence, and padding or none. Up to 12 sequences, so
    both ways of writing block tables run."""
    bs = draw(st.sampled_from([1, 2, 4]))
    blocks = draw(st.integers(2, 5))
    pad_block = draw(st.integers(1, 20))

    def span(prefill: bool) -> SequenceSpan:
        seq_len = draw(st.integers(1 if prefill else 2, blocks * bs))
        query_len = draw(st.integers(1, seq_len)) if prefill else 1
        if prefill and query_len == 1 and seq_len > 1:  # that would be a decode
            query_len = seq_len
        length = draw(st.integers(-(-seq_len // bs), blocks))
        table = draw(st.lists(st.integers(0, pad_block - 1), min_size=length, max_size=length))
        return SequenceSpan(seq_len, query_len, draw(st.sampled_from([tuple(table), table])))

    spans = [span(True) for _ in range(draw(st.integers(0, 3)))]
    spans += [span(False) for _ in range(draw(st.integers(0, 12 - len(spans))))]
    actual = sum(s.query_len for s in spans)
    num_tokens = draw(st.one_of(st.none(), st.integers(actual, actual + 6)))
    num_seqs = draw(st.one_of(st.none(), st.integers(len(spans), len(spans) + 3)))
    limits = dict(max_batch_size=max((num_seqs or 0) + draw(st.integers(0, 2)), len(spans), 1),
                  max_num_tokens=max((num_tokens or 0) + draw(st.integers(0, 4)), actual, 1),
                  max_blocks_per_seq=blocks, block_size=bs, pad_slot=pad_block * bs)
    return limits, spans, num_tokens, num_seqs


@pytest.mark.property
@settings(max_examples=50)
@given(accepted_batches())
def test_accepted_batches_match_the_per_token_reference(batch) -> None:
    assert_prepare_matches_reference(*batch)


SEQUENCE_DEFECTS = ("query_len 0", "seq_len below query_len", "too many blocks", "too few blocks",
                    "negative block", "pad block")
BATCH_DEFECTS = ("one sequence too many", "num_seqs too small", "num_tokens too small",
                 "num_tokens too large")


def plant(defect: str, span: SequenceSpan, limits: dict[str, int]) -> SequenceSpan:
    table, bs, blocks = list(span.block_table), limits["block_size"], limits["max_blocks_per_seq"]
    changed = {
        "query_len 0": dict(query_len=0),
        "seq_len below query_len": dict(seq_len=span.query_len - 1),
        "too many blocks": dict(block_table=table + [0] * (blocks + 1 - len(table))),
        "too few blocks": dict(block_table=table[:cdiv(span.seq_len, bs) - 1]),
        "negative block": dict(block_table=table[:-1] + [-1]),
        "pad block": dict(block_table=[limits["pad_slot"] // bs] + table[1:]),
    }[defect]
    return dataclasses.replace(span, **changed)


@pytest.mark.property
@settings(max_examples=50)
@given(accepted_batches(), st.sampled_from(("sequence", "order", "batch")),
       st.permutations(SEQUENCE_DEFECTS), st.integers(1, 3), st.sampled_from(BATCH_DEFECTS),
       st.data())
def test_refused_batches_name_the_reference_problem(batch, kind, defects, count, batch_defect,
                                                    data) -> None:
    # One kind of trouble per batch: up to three defects in one sequence (which check a sequence
    # fails first counts); the first sequence moved last (a prefill after the decodes); or a batch
    # defect on top of one sequence defect (the batch's own checks come first). No sequence defect
    # changes the token count, so the batch's checks pass unless a batch defect is planted.
    limits, spans, num_tokens, num_seqs = batch
    spans, actual = list(spans), sum(s.query_len for s in spans)
    if spans and kind != "order":
        i = data.draw(st.integers(0, len(spans) - 1))
        for defect in defects[:count if kind == "sequence" else 1]:
            spans[i] = plant(defect, spans[i], limits)
    if kind == "order":
        spans = spans[1:] + spans[:1]
    if kind == "batch":
        if batch_defect == "one sequence too many":
            spans += [SequenceSpan(1, 1, [0])] * (limits["max_batch_size"] + 1 - len(spans))
        if batch_defect == "num_seqs too small":
            num_seqs = len(spans) - 1
        if batch_defect == "num_tokens too small":
            num_tokens = actual - 1
        if batch_defect == "num_tokens too large":
            num_tokens = limits["max_num_tokens"] + 1
    assert_prepare_matches_reference(limits, spans, num_tokens, num_seqs)


@pytest.mark.parametrize("span,problem", [
    (SequenceSpan(9, 0, [0, 10, 1, 2]), "query_len 0 must lie in [1, seq_len 9]"),
    (SequenceSpan(9, 1, [0, 10, 1, 2]), "4 blocks exceed max_blocks_per_seq 3"),
    (SequenceSpan(9, 1, [10, -1]), "seq_len 9 needs 3 blocks of 4, block_table has 2"),
    (SequenceSpan(9, 9, [10, -1, 3]), "block ids [10, -1] outside [0, 9]"),
])
def test_a_sequence_failing_several_checks_is_named_by_the_first(span, problem) -> None:
    # Checks in order: query_len, table length, blocks for seq_len, block ids, prefill order.
    md = metadata()
    with pytest.raises(ValueError) as refused:
        md.prepare([SequenceSpan(5, 1, [0, 1]), span, SequenceSpan(3, 3, [12])])
    assert str(refused.value).startswith(f"sequence 1: {problem}")
