"""The Triton paged-decode kernel against the torch-ops implementation and the float64 reference.

Two ways to run it: under Triton's interpreter on CPU tensors (TRITON_INTERPRET=1, where triton is
importable: the CPU test), and on CUDA (marker gpu, without the interpreter). Where neither holds
(CI's CPU wheel has no triton) every test here skips with its reason.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given

from suites.ops.batches import Batch
from suites.ops.decode_cases import (SCALE, assert_kernel_matches, decode_batch, kernel_batches,
                                     kernel_output, replay_on_a_later_batch, with_decode_kernel)
from suites.ops.triton_marks import needs_compiled_triton, needs_interpreter, needs_triton

CASES = {
    "decode-gqa4": dict(lengths=[(7, 1), (40, 1), (2, 1), (17, 1)], heads=8, kv_heads=2),
    "decode-mqa-odd-group": dict(lengths=[(33, 1), (5, 1)], heads=3, kv_heads=1, block_size=3),
    "decode-padded": dict(lengths=[(9, 1), (16, 1)], pad_tokens=2, pad_seqs=1, block_size=16),
    "mixed": dict(lengths=[(6, 6), (3, 3), (10, 1)], heads=4, kv_heads=2, head_dim=12),
    "llama-1b-head": dict(lengths=[(70, 1)], heads=32, kv_heads=8, head_dim=64, block_size=16),
}


@needs_triton
@needs_interpreter
@pytest.mark.parametrize("case", list(CASES))
def test_interpreted_kernel_matches_torch_ops(case: str) -> None:
    batch = decode_batch(**CASES[case])
    assert_kernel_matches(batch, kernel_output(batch))


@needs_triton
@needs_interpreter
@pytest.mark.property
@given(kernel_batches())
def test_interpreted_kernel_matches_on_random_batches(composition) -> None:
    batch = decode_batch(**composition)
    assert_kernel_matches(batch, kernel_output(batch))


@needs_triton
@needs_interpreter
def test_kernel_check_fails_on_a_wrong_scale() -> None:
    # In fp32, where the tolerance is tight enough to see a 5% error in the scale.
    batch = decode_batch(**CASES["decode-gqa4"], dtype=torch.float32)
    with pytest.raises(AssertionError, match="from the"):
        assert_kernel_matches(batch, kernel_output(batch, SCALE * 1.05))


def cuda_batch(case: str) -> Batch:
    return decode_batch(**CASES[case], device="cuda")


@needs_triton
@needs_compiled_triton
@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_kernel_matches_torch_ops(case: str) -> None:
    batch = cuda_batch(case)
    assert_kernel_matches(batch, kernel_output(batch))


@needs_triton
@needs_compiled_triton
@pytest.mark.gpu
def test_cuda_op_replays_in_a_cuda_graph_for_a_new_batch() -> None:
    """paged_attention() on a decode-only batch dispatches to the kernel; captured once, a replay
    after the metadata holds another batch of the same shape (longer contexts, other blocks)
    matches the torch-ops path on that batch."""
    first = cuda_batch("decode-gqa4")
    # Other lengths in as many blocks (a cache and metadata of the same shape), other values.
    later = decode_batch(**{**CASES["decode-gqa4"], "lengths": [(8, 1), (37, 1), (4, 1), (20, 1)],
                            "seed": 5}, device="cuda")
    kernel_md = with_decode_kernel(first.metadata, first.spans, "triton")
    assert_kernel_matches(later, replay_on_a_later_batch(first, later, kernel_md, SCALE))
