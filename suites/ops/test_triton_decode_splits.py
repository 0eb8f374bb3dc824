"""The paged-decode kernel's sequence split and combine: long contexts cut into many runs of many
tiles, uneven runs, idle splits of short contexts in a wide block table, and every split count and
tile width agreeing with the torch-ops path and the float64 reference. A split that drops or
repeats a tile, or a combine that weighs the runs wrongly, is off by far more than the tolerance.

Under Triton's interpreter (TRITON_INTERPRET=1) on CPU tensors, and on CUDA (marker gpu) where a
CUDA graph captured at one set of context lengths is replayed at others.
"""

from __future__ import annotations

import pytest
import torch

from suites.ops.decode_cases import (SCALE, assert_kernel_matches, decode_batch, kernel_output,
                                     replay_on_a_later_batch, with_decode_kernel)
from suites.ops.triton_marks import needs_compiled_triton, needs_interpreter, needs_triton

LLAMA_1B = dict(heads=32, kv_heads=8, head_dim=64, block_size=16)

LONG_CASES = {
    # 2000 tokens at batch 1: the default splits it into 32 runs of two 32-token tiles.
    "batch1-2000": dict(lengths=[(2000, 1)], **LLAMA_1B),
    # Uneven lengths in one batch: runs of different sizes per row, a last run shorter than the
    # others, a row whose later splits are idle.
    "uneven-rows": dict(lengths=[(1000, 1), (37, 1), (513, 1)], heads=8, kv_heads=2,
                        head_dim=16, block_size=16),
    # Pages of 3 slots: a tile spans pages, a page spans tiles.
    "odd-pages": dict(lengths=[(301, 1), (95, 1)], heads=6, kv_heads=2, head_dim=12,
                      block_size=3),
    # A short context in a table 128 blocks wide: most splits have nothing to attend.
    "short-in-wide-table": dict(lengths=[(20, 1)], max_blocks_per_seq=128, **LLAMA_1B),
    "padded-long": dict(lengths=[(700, 1)], pad_tokens=2, pad_seqs=1, heads=4, kv_heads=1,
                        head_dim=8, block_size=16),
}


@needs_triton
@needs_interpreter
@pytest.mark.parametrize("case", list(LONG_CASES))
def test_interpreted_long_contexts_match(case: str) -> None:
    batch = decode_batch(**LONG_CASES[case])
    assert_kernel_matches(batch, kernel_output(batch))


SPLIT_BATCH = dict(lengths=[(257, 1), (64, 1), (5, 1)], heads=4, kv_heads=2, head_dim=8,
                   block_size=16)


@needs_triton
@needs_interpreter
@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 64])
@pytest.mark.parametrize("tile_tokens", [4, 16, 64])
def test_interpreted_every_split_and_tile_matches(num_splits: int, tile_tokens: int) -> None:
    # fp32, where the tolerance is tight enough to see one tile too many or too few.
    batch = decode_batch(**SPLIT_BATCH, dtype=torch.float32)
    assert_kernel_matches(batch, kernel_output(batch, num_splits=num_splits,
                                               tile_tokens=tile_tokens))


@needs_triton
@pytest.mark.parametrize("bad", [dict(num_splits=0), dict(num_splits=65), dict(tile_tokens=24)])
def test_split_arguments_out_of_range_are_refused(bad: dict) -> None:
    batch = decode_batch(**SPLIT_BATCH)
    name = next(iter(bad))
    with pytest.raises(ValueError, match=f"{name} must be .* got {bad[name]}"):
        kernel_output(batch, **bad)


@needs_triton
def test_split_count_follows_the_shapes() -> None:
    from harness.ops.triton_decode import MAX_SPLITS, decode_splits

    # Batch 1 of the 1B shape (8 kv heads) is split to fill 256 programs; batch 16 (128 programs)
    # in two; a grid already full is not split; a table of one tile is never split.
    assert decode_splits(1, 8, 2048) == 32
    assert decode_splits(16, 8, 2048) == 2
    assert decode_splits(64, 8, 2048) == 1
    assert decode_splits(1, 8, 16) == 1
    assert decode_splits(1, 1, 1 << 20) == MAX_SPLITS


@needs_triton
@needs_compiled_triton
@pytest.mark.gpu
@pytest.mark.parametrize("case", ["batch1-2000", "uneven-rows", "short-in-wide-table"])
def test_cuda_long_contexts_match(case: str) -> None:
    batch = decode_batch(**LONG_CASES[case], device="cuda")
    assert_kernel_matches(batch, kernel_output(batch))


@needs_triton
@needs_compiled_triton
@pytest.mark.gpu
def test_cuda_graph_captured_short_replays_long() -> None:
    """One grid for every length the table holds: captured while row 0 has 16 tokens and row 1
    1990, replayed with the two swapped (as many blocks, so the same cache and metadata shapes),
    row 0's context now runs over every split."""
    first = decode_batch(lengths=[(16, 1), (1990, 1)], **LLAMA_1B, device="cuda")
    later = decode_batch(lengths=[(1990, 1), (16, 1)], **LLAMA_1B, seed=9, device="cuda")
    kernel_md = with_decode_kernel(first.metadata, first.spans, "triton")
    assert_kernel_matches(later, replay_on_a_later_batch(first, later, kernel_md, SCALE))
