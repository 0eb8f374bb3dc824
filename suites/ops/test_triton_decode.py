"""The Triton paged-decode kernel against the torch-ops implementation and the float64 reference.

Two ways to run it: under Triton's interpreter on CPU tensors (TRITON_INTERPRET=1, where triton is
importable: the CPU test), and on CUDA (marker gpu, without the interpreter). Where neither holds
(CI's CPU wheel has no triton) every test here skips with its reason.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from hypothesis import given

from harness.ops import AttentionMetadata
from suites.ops.batches import Batch
from suites.ops.decode_cases import (decode_batch, kernel_batches, replay_on_a_later_batch, tolerance,
                                     torch_ops_output, write_new_tokens)
from suites.ops.reference import naive_attention
from suites.ops.triton_marks import needs_compiled_triton, needs_interpreter, needs_triton

SCALE = 0.35


def kernel_output(batch: Batch, scale: float = SCALE, **launch) -> torch.Tensor:
    """The kernel's output on `batch`; `launch` goes to the launcher (num_splits, tile_tokens)."""
    from harness.ops.triton_decode import paged_decode_triton

    write_new_tokens(batch)
    out = torch.full_like(batch.q, 7.0)
    _, positions, token_to_seq, seq_lens, block_tables = batch.metadata.op_inputs()
    paged_decode_triton(batch.q, batch.cache.layer(0), positions, token_to_seq, seq_lens,
                        block_tables, scale, out, **launch)
    return out


def assert_kernel_matches(batch: Batch, out: torch.Tensor, scale: float = SCALE) -> None:
    """Real rows within tolerance of the torch-ops path and of the float64 reference; padded rows
    (they see nothing) zero."""
    n, dtype = batch.num_actual_tokens, batch.q.dtype
    values = torch.cat(batch.values).float()
    expected = naive_attention(batch.queries, batch.keys, batch.values, scale)
    torch_ops = torch_ops_output(batch, scale)[:n].double().cpu()
    real = out[:n].double().cpu()
    limit = tolerance(expected, values, dtype)
    against_reference = (real - expected).abs().max().item()
    against_torch_ops = (real - torch_ops).abs().max().item()
    assert against_reference <= limit, f"{against_reference:.3g} from the float64 reference > {limit:.3g}"
    assert against_torch_ops <= 2 * limit, f"{against_torch_ops:.3g} from the torch-ops path > {2 * limit:.3g}"
    assert not out[n:].any(), "a padded row (it sees nothing) is not zero"


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


def with_decode_kernel(metadata: AttentionMetadata, spans, kernel: str) -> AttentionMetadata:
    """A metadata like `metadata` (same sizes and device) for `spans`, attending with `kernel`."""
    twin = AttentionMetadata(metadata.max_batch_size, metadata.max_num_tokens,
                             metadata.max_blocks_per_seq, metadata.block_size, metadata.pad_slot,
                             metadata.device, decode_kernel=kernel)
    twin.prepare(spans, num_tokens=metadata.max_num_tokens, num_seqs=metadata.max_batch_size)
    return twin


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
