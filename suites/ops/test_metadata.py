"""AttentionMetadata: values, padding, counts, validation, and buffers that never move."""

from __future__ import annotations

import pytest
import torch

from harness.graphs.pointers import snapshot_tensors
from torch.utils._python_dispatch import TorchDispatchMode

from harness.ops import AttentionMetadata, SequenceSpan

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
