"""The Triton rope + KV-write kernel: one program per token row rotates its query heads in place
and writes its rotated key heads and its value heads into the paged cache at its slot (vLLM's
rotary_embedding and reshape_and_cache as one kernel).

Importing this module imports triton; `harness.ops.rope_kv_write` imports it only where the kernel
runs (a CUDA tensor). Under TRITON_INTERPRET=1 (set before this module is first imported) the same
launcher runs on CPU tensors, which is how the CPU suites check it.

The grid is (token rows,), fixed by the shapes; each program reads its slot from device memory, so
a launch reads nothing on the host and can be recorded in a CUDA graph. Padded rows write the pad
sink, as the torch path does.

Numerics are the torch path's (`harness.ops.rotary.apply_rotary_`): x * cos rounded to the model
dtype, then + roll(x, half) * signed_sin with one rounding at the end.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from harness.ops.pdl_support import pdl_launch_options
from harness.ops.triton_pdl import pdl_launch_dependents, pdl_wait


@triton.jit
def _rotate(ptr, rows, d, mask, cos, sin, stride_row, stride_d, HALF: tl.constexpr,
            HEAD_DIM: tl.constexpr):
    x = tl.load(ptr + rows[:, None] * stride_row + d[None, :] * stride_d, mask=mask, other=0.0)
    rolled_d = (d + HALF) % HEAD_DIM
    rolled = tl.load(ptr + rows[:, None] * stride_row + rolled_d[None, :] * stride_d, mask=mask,
                     other=0.0).to(tl.float32)
    # x * cos is rounded to the model dtype before the add, as the torch path's mul_ rounds it.
    scaled = (x.to(tl.float32) * cos[None, :]).to(x.dtype).to(tl.float32)
    return (scaled + rolled * sin[None, :]).to(x.dtype)


@triton.jit
def _rope_kv_write_kernel(
        q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, kv_ptr, slot_mapping_ptr,
        stride_qt, stride_qh, stride_qd,
        stride_kt, stride_kh, stride_kd,
        stride_vt, stride_vh, stride_vd,
        stride_ct, stride_cd, stride_st, stride_sd,
        stride_kv, stride_kvb, stride_kvs, stride_kvh, stride_kvd,
        HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, PADDED_HEADS: tl.constexpr, PADDED_KV_HEADS: tl.constexpr,
        PADDED_DIM: tl.constexpr, USE_PDL: tl.constexpr = False):
    token = tl.program_id(0)
    d = tl.arange(0, PADDED_DIM)
    d_ok = d < HEAD_DIM
    if USE_PDL:
        # cos/sin, q, k, v and the slot mapping are all earlier work.
        pdl_wait()
        pdl_launch_dependents()
    cos = tl.load(cos_ptr + token * stride_ct + d * stride_cd, mask=d_ok, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + token * stride_st + d * stride_sd, mask=d_ok, other=0.0).to(tl.float32)

    h = tl.arange(0, PADDED_HEADS)
    q_mask = (h < HEADS)[:, None] & d_ok[None, :]
    q_row = q_ptr + token * stride_qt
    q = _rotate(q_row, h, d, q_mask, cos, sin, stride_qh, stride_qd, HEAD_DIM // 2, HEAD_DIM)
    tl.store(q_row + h[:, None] * stride_qh + d[None, :] * stride_qd, q, mask=q_mask)

    g = tl.arange(0, PADDED_KV_HEADS)
    kv_mask = (g < KV_HEADS)[:, None] & d_ok[None, :]
    k = _rotate(k_ptr + token * stride_kt, g, d, kv_mask, cos, sin, stride_kh, stride_kd,
                HEAD_DIM // 2, HEAD_DIM)
    v = tl.load(v_ptr + token * stride_vt + g[:, None] * stride_vh + d[None, :] * stride_vd,
                mask=kv_mask, other=0.0)
    slot = tl.load(slot_mapping_ptr + token)
    cell = (kv_ptr + (slot // BLOCK_SIZE) * stride_kvb + (slot % BLOCK_SIZE) * stride_kvs
            + g[:, None] * stride_kvh + d[None, :] * stride_kvd)
    tl.store(cell, k.to(kv_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(cell + stride_kv, v.to(kv_ptr.dtype.element_ty), mask=kv_mask)


def rope_kv_write_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, kv_layer: torch.Tensor, slot_mapping: torch.Tensor, *,
                         pdl: bool = False) -> None:
    """q [T, H, D] rotated in place; k rotated and v as it is written into kv_layer
    [2, blocks, block_size, KVH, D] at slot_mapping [T]; cos/sin [T, 1, D] (any strides).
    `pdl`: launched with Programmatic Dependent Launch (triton_pdl.py)."""
    launch = pdl_launch_options(pdl)
    tokens, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    if tokens == 0:
        return
    block_size = kv_layer.shape[2]
    _rope_kv_write_kernel[(tokens,)](
        q, k, v, cos, sin, kv_layer, slot_mapping,
        *q.stride(), *k.stride(), *v.stride(),
        cos.stride(0), cos.stride(2), sin.stride(0), sin.stride(2),
        *kv_layer.stride(),
        HEADS=heads, KV_HEADS=kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        PADDED_HEADS=triton.next_power_of_2(heads), PADDED_KV_HEADS=triton.next_power_of_2(kv_heads),
        PADDED_DIM=triton.next_power_of_2(head_dim), **launch)
