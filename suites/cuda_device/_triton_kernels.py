"""Triton kernels of the kind runtimes launch on "cuda" tensors, for test_triton_kernels.py.
Importing this module imports triton: the tests import it only once triton is known to be there."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton


@triton.jit
def store_kvcache_kernel(key_ptr, key_stride, value_ptr, value_stride, k_cache_ptr, v_cache_ptr,
                         slot_mapping_ptr, D: tl.constexpr):
    """nano-vllm's: each token's K and V rows into the caches at its slot (-1: no slot)."""
    idx = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + idx)
    if slot == -1:
        return
    key = tl.load(key_ptr + idx * key_stride + tl.arange(0, D))
    value = tl.load(value_ptr + idx * value_stride + tl.arange(0, D))
    cache_offsets = slot * D + tl.arange(0, D)
    tl.store(k_cache_ptr + cache_offsets, key)
    tl.store(v_cache_ptr + cache_offsets, value)


@triton.jit
def blocked_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out[0] = sum of x[:n], BLOCK at a time: a loop bounded by a scalar argument, as the
    decode GEMVs loop over K."""
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    tl.store(out_ptr, tl.sum(acc, axis=0))


@triton.jit
def masked_copy_kernel(x_ptr, out_ptr, n, first, last, BLOCK: tl.constexpr):
    """out[:n] = x[:n] where the run [first, last) is not empty: a block mask and-ed with a scalar
    comparison, as the paged-decode kernel's split masks its rows."""
    offsets = tl.arange(0, BLOCK)
    mask = (offsets < n) & (first < last)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask, other=0.0), mask=mask)


@triton.jit
def _scaled_row(out_ptr, row, scale, offsets, mask):
    tl.store(out_ptr + offsets, row * scale, mask=mask)


@triton.jit
def scaled_store_kernel(x_ptr, out_ptr, slot_ptr, n, scale, BLOCK: tl.constexpr):
    """Row i of x, times `scale`, into row slot[i] of out; `n` columns. The store is in a jitted
    helper: the write is found through it."""
    i = tl.program_id(0)
    slot = tl.load(slot_ptr + i)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    row = tl.load(x_ptr + i * n + offsets, mask=mask)
    _scaled_row(out_ptr + slot * n, row, scale, offsets, mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 4}), triton.Config({"BLOCK": 8})], key=["n"])
@triton.jit
def autotuned_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    start = tl.program_id(0) * BLOCK
    offsets = start + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask)
             + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.heuristics({"BLOCK": lambda args: triton.next_power_of_2(args["n"])})
@triton.jit
def heuristic_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.atomic_add(out_ptr, tl.sum(tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)))


def _zero_the_output(arguments) -> None:
    arguments["out_ptr"].zero_()


@triton.autotune(configs=[triton.Config({"BLOCK": 4}, pre_hook=_zero_the_output),
                          triton.Config({"BLOCK": 8}, pre_hook=_zero_the_output)], key=["n"])
@triton.jit
def accumulated_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """x + y added into out, which each config's pre_hook zeroes first (as split-K kernels
    zero their accumulator)."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.atomic_add(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask)
                  + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton_op("harness_tests::scaled_row", mutates_args={})
def scaled_row(x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """A `torch.library.triton_op`: row slots[0] of a fresh zero tensor shaped as `x` gets row 0
    of x times 2, through `scaled_store_kernel`."""
    out = torch.zeros_like(x)
    wrap_triton(scaled_store_kernel)[(1,)](x, out, slots, x.shape[1], 2.0, BLOCK=4)
    return out


@torch.library.custom_op("harness_tests::scaled_row_cuda", mutates_args=(), device_types="cuda")
def scaled_row_cuda(x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """`scaled_row` as runtimes register their ops (vLLM's direct_register_custom_op): a CUDA
    kernel in Python that launches the Triton kernel."""
    out = torch.zeros_like(x)
    scaled_store_kernel[(1,)](x, out, slots, x.shape[1], 2.0, BLOCK=4)
    return out


@scaled_row_cuda.register_fake
def _(x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)
