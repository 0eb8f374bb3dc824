"""The Triton greedy ranking: each row's greedy token, its logprob and the row's logit scale in two
kernels over the vocabulary, where the torch path (`harness.ranking.rank_logits` at width 1, then
`pack_ranked`) runs a cast, the ordered-bits ops, an argmax, a log_softmax, a gather, an abs, an
amax and the packing: about ten kernels, two of them single-block reductions over the whole row.

Importing this module imports triton; `harness.ops.greedy_ranking` imports it only where the kernel
runs (a CUDA tensor). Under TRITON_INTERPRET=1 (set before this module is first imported) the same
launcher runs on CPU tensors, which is how the CPU suites check it.

Stage one: program (c, r) reduces chunk c of row r to its best key and that key's first index, its
maximum, the sum of exp(x - maximum) over the chunk and the largest |x| (as bits). Stage two: one
program per row combines the chunks in a fixed order and writes the packed row (token, logprob,
scale, as `pack_ranked` lays it out) and the token as int64. No atomics: the same sums in the same
order at every launch.

What is exact, and what is not: the token is chosen on the same int32 keys as `ordered_bits` (fp32
bits ordered as the values, -0.0 equal to +0.0, the lowest id among equal maxima), so it is the
torch path's token bit for bit, NaN included; the scale is a maximum, exact. The logprob is
-log(sum exp(x - max)) (the token's logit is the maximum), summed per chunk first: it differs from
log_softmax's by float rounding only (a few fp32 ulps).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from harness.ops.pdl_support import pdl_launch_options
from harness.ops.triton_pdl import pdl_launch_dependents, pdl_wait

CHUNK = 4096  # vocabulary entries per stage-one program: 32 programs a row at a 128k vocabulary
INT32_MIN = -2 ** 31


@triton.jit
def _key_value(key):
    """The fp32 value whose ordered key (`ordered_bits`) is `key`."""
    bits = tl.where(key < 0, key ^ 0x7FFFFFFF, key)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _chunk_kernel(logits_ptr, key_ptr, index_ptr, abs_ptr, max_ptr, sum_ptr, vocab, chunks,
                  stride_row, stride_col, lowest_key, CHUNK_SIZE: tl.constexpr,
                  USE_PDL: tl.constexpr = False):
    chunk = tl.program_id(0)
    row = tl.program_id(1)
    cols = chunk * CHUNK_SIZE + tl.arange(0, CHUNK_SIZE)
    ok = cols < vocab
    if USE_PDL:
        # The logits are the kernel before's output.
        pdl_wait()
        pdl_launch_dependents()
    x = tl.load(logits_ptr + row * stride_row + cols * stride_col, mask=ok,
                other=float("-inf")).to(tl.float32)
    bits = x.to(tl.int32, bitcast=True)
    bits = tl.where((bits & 0x7FFFFFFF) == 0, 0, bits)  # -0.0 ranks as +0.0 (ordered_bits's + 0.0)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    # Past the vocabulary: no logit's key is lower, and a tie goes to the lower (real) index.
    key = tl.where(ok, key, lowest_key)
    best, at = tl.max(key, axis=0, return_indices=True, return_indices_tie_break_left=True)
    top = _key_value(best)
    shifted = tl.where(ok, tl.exp(x - top), 0.0)
    # A chunk whose maximum is -inf adds nothing (its exp(-inf - -inf) would be NaN); a NaN or +inf
    # maximum propagates, as log_softmax's does.
    total = tl.where(top == float("-inf"), 0.0, tl.sum(shifted, axis=0))
    largest = tl.max(tl.where(ok, bits & 0x7FFFFFFF, 0), axis=0)
    slot = row * chunks + chunk
    tl.store(key_ptr + slot, best)
    tl.store(index_ptr + slot, chunk * CHUNK_SIZE + at)
    tl.store(abs_ptr + slot, largest)
    tl.store(max_ptr + slot, top)
    tl.store(sum_ptr + slot, total)


@triton.jit
def _combine_kernel(key_ptr, index_ptr, abs_ptr, max_ptr, sum_ptr, values_ptr, tokens_ptr, chunks,
                    stride_vrow, stride_vcol, lowest_key, BLOCK_CHUNKS: tl.constexpr,
                    USE_PDL: tl.constexpr = False):
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK_CHUNKS)
    ok = c < chunks
    if USE_PDL:
        pdl_wait()
        pdl_launch_dependents()
    slot = row * chunks + c
    keys = tl.load(key_ptr + slot, mask=ok, other=lowest_key)
    best = tl.max(keys, axis=0)
    # Chunks hold ascending ids and each names its first best index: the smallest among the chunks
    # that reach the best key is the row's first.
    token = tl.min(tl.where(ok & (keys == best), tl.load(index_ptr + slot, mask=ok, other=0),
                            2147483647), axis=0)
    top = _key_value(best)
    maxima = tl.load(max_ptr + slot, mask=ok, other=float("-inf"))
    sums = tl.load(sum_ptr + slot, mask=ok, other=0.0)
    total = tl.sum(tl.where(sums > 0.0, sums * tl.exp(maxima - top), sums), axis=0)
    # Every logit -inf: log_softmax is NaN throughout.
    logprob = tl.where(top == float("-inf"), float("nan"), -tl.log(total))
    scale = tl.max(tl.load(abs_ptr + slot, mask=ok, other=0), axis=0).to(tl.float32, bitcast=True)
    out = values_ptr + row * stride_vrow
    tl.store(out, token.to(tl.float32))
    tl.store(out + stride_vcol, logprob)
    tl.store(out + 2 * stride_vcol, scale)
    tl.store(tokens_ptr + row, token.to(tl.int64))


def greedy_pack_triton(logits: torch.Tensor, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [rows, 3] float32: token id, its logprob, max |logit|; tokens [rows] int64) of
    `logits` [rows, vocab]; `pdl`: both kernels launched with Programmatic Dependent Launch."""
    launch = pdl_launch_options(pdl)
    rows, vocab = logits.shape
    values = torch.empty((rows, 3), dtype=torch.float32, device=logits.device)
    tokens = torch.empty((rows,), dtype=torch.int64, device=logits.device)
    if rows == 0:
        return values, tokens
    chunks = triton.cdiv(vocab, CHUNK)
    ints = torch.empty((3, rows, chunks), dtype=torch.int32, device=logits.device)
    floats = torch.empty((2, rows, chunks), dtype=torch.float32, device=logits.device)
    _chunk_kernel[(chunks, rows)](logits, ints[0], ints[1], ints[2], floats[0], floats[1], vocab,
                                  chunks, *logits.stride(), INT32_MIN, CHUNK_SIZE=CHUNK, num_warps=8,
                                  **launch)
    _combine_kernel[(rows,)](ints[0], ints[1], ints[2], floats[0], floats[1], values, tokens,
                             chunks, *values.stride(), INT32_MIN,
                             BLOCK_CHUNKS=max(16, triton.next_power_of_2(chunks)), num_warps=1,
                             **launch)
    return values, tokens
