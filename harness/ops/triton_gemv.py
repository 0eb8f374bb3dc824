"""The Triton decode GEMV kernels: y = x @ W^T for a few rows of x (decode batches), with the
layer's RMSNorm as a prologue, its residual add as an epilogue, or gate and up rows read in one
pass and combined as silu(gate) * up.

Importing this module imports triton; `harness.ops.decode_linear` imports it only where a kernel
runs (a CUDA tensor). Under TRITON_INTERPRET=1 (set before this module is first imported) the same
launchers run on CPU tensors, which is how the CPU suites check them.

Two kernels serve every variant (constexpr flags), chosen by the config (`gemv_configs.py`):
the row-tile kernel multiplies in registers, the tensor-core kernel (`GemvConfig.mma`, 16-bit
operands, at most 16 rows of x padded to 16) feeds W's tiles to `tl.dot`, so Triton's pipeliner
streams them through shared memory several tiles ahead; the 1B's gate_up runs there. In both,
program (i, s) owns output columns
[i * BLOCK_N, (i + 1) * BLOCK_N) for every row of x, and reads its rows of W over the s-th slice of
K. Each program carries all M rows of x (M <= a few), so W, the bulk of the bytes, is read once.
With a split (s > 1 programs per row block) each writes fp32 partial sums and a second kernel adds
them in a fixed order, then applies the epilogue: no atomics, the same sums in the same order at
every launch. Shapes fix the grid and nothing is read on the host, so launches can be captured.

Numerics follow the torch ops they replace (`decode_linear.py`'s torch implementations): the norm
as `F.rms_norm` computes it for a half-precision input (fp32 statistics, the normalised value
rounded to the model dtype, then the product with the weight rounded), products summed in fp32,
one rounding of the sum (+ bias + residual); the gated variant rounds gate and up, silu(gate) and
the product, as the separate ops do.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from harness.ops.gemv_configs import (MMA_MAX_ROWS, GemvConfig, block_m, choose_gemv_config,
                                      sm_count)
from harness.ops.pdl_support import pdl_launch_options
from harness.ops.triton_pdl import pdl_launch_dependents, pdl_wait, prefetch_rows_to_l2


@triton.jit
def _weights(w_ptr, rows, rows_ok, kk, k_ok, stride_wn, stride_wk):
    """W[rows, kk] as a [BLOCK_N, BLOCK_K] fp32 tile (0 outside)."""
    return tl.load(w_ptr + rows[:, None] * stride_wn + kk[None, :] * stride_wk,
                   mask=rows_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)


@triton.jit
def _finish(acc, acc_up, m, m_ok, n, n_ok, up_offset, bias_ptr, res_ptr, out_ptr, stride_rm,
            stride_rn, stride_om, stride_on, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
            GATED: tl.constexpr):
    dtype = out_ptr.dtype.element_ty
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if GATED:
        if HAS_BIAS:
            acc_up += tl.load(bias_ptr + up_offset + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        # The separate path's roundings: gate and up from the GEMM, silu(gate), then the product.
        gate = acc.to(dtype).to(tl.float32)
        up = acc_up.to(dtype).to(tl.float32)
        acc = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32) * up
    if HAS_RESIDUAL:
        acc += tl.load(res_ptr + m[:, None] * stride_rm + n[None, :] * stride_rn,
                       mask=m_ok[:, None] & n_ok[None, :], other=0.0).to(tl.float32)
    tl.store(out_ptr + m[:, None] * stride_om + n[None, :] * stride_on, acc.to(dtype),
             mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _write_result(acc, acc_up, pid_k, m, m_ok, n, n_ok, M, N, up_offset, part_ptr, bias_ptr,
                  res_ptr, out_ptr, stride_rm, stride_rn, stride_om, stride_on,
                  HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, GATED: tl.constexpr,
                  SPLIT: tl.constexpr):
    """A GEMV program's sums: with SPLIT its slice's fp32 partials for `_split_sum_kernel`, else
    through the epilogue to the output."""
    if SPLIT:
        tl.store(part_ptr + (pid_k * M + m[:, None]) * N + n[None, :], acc,
                 mask=m_ok[:, None] & n_ok[None, :])
    else:
        _finish(acc, acc_up, m, m_ok, n, n_ok, up_offset, bias_ptr, res_ptr, out_ptr, stride_rm,
                stride_rn, stride_om, stride_on, HAS_BIAS, HAS_RESIDUAL, GATED)


@triton.jit
def _row_rstd(x_rows, m_ok, K, eps, stride_xk, HAS_NORM: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_K: tl.constexpr):
    """1 / rms of each row of x over all of K (zeros without HAS_NORM: the norm compiled out).
    Every program needs its rows' full statistics, whatever slice of K it multiplies: x is a few
    KB, read from L2."""
    if HAS_NORM:
        squares = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            xv = tl.load(x_rows + kk[None, :] * stride_xk, mask=m_ok[:, None] & (kk < K)[None, :],
                         other=0.0).to(tl.float32)
            squares += tl.sum(xv * xv, axis=1)
        return tl.rsqrt(squares / K + eps)
    return tl.zeros([BLOCK_M], dtype=tl.float32)


@triton.jit
def _x_tile(x_rows, m_ok, kk, k_ok, norm_ptr, rstd, stride_xk, dtype, HAS_NORM: tl.constexpr):
    """x[:, kk] as the model dtype, normalised first with HAS_NORM (the torch path's roundings)."""
    xv = tl.load(x_rows + kk[None, :] * stride_xk, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
    if HAS_NORM:
        scale = tl.load(norm_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
        normed = (xv.to(tl.float32) * rstd[:, None]).to(dtype).to(tl.float32)
        xv = (normed * scale[None, :]).to(dtype)
    return xv


@triton.jit
def _tile(acc, acc_up, wide, wide_up, w, w_up, x_rows, m_ok, kk, k_ok, norm_ptr, rstd, stride_xk,
          dtype, HAS_NORM: tl.constexpr, GATED: tl.constexpr, BLOCK_M: tl.constexpr,
          BLOCK_K: tl.constexpr):
    """One K tile's products of x (normalised first with HAS_NORM) with the weight tiles w (and
    w_up, the up rows, with GATED), added to the accumulators."""
    xf = _x_tile(x_rows, m_ok, kk, k_ok, norm_ptr, rstd, stride_xk, dtype, HAS_NORM).to(tl.float32)
    if BLOCK_M == 1:
        x_row = tl.reshape(xf, [BLOCK_K])[None, :]
        wide += w * x_row
        if GATED:
            wide_up += w_up * x_row
    else:
        acc += tl.sum(xf[:, None, :] * w[None, :, :], axis=2)
        if GATED:
            acc_up += tl.sum(xf[:, None, :] * w_up[None, :, :], axis=2)
    return acc, acc_up, wide, wide_up


@triton.jit
def _gemv_kernel(
        x_ptr, w_ptr, bias_ptr, res_ptr, norm_ptr, out_ptr, part_ptr,
        M, N, K, k_per_split, up_offset, eps,
        stride_xm, stride_xk, stride_wn, stride_wk, stride_rm, stride_rn, stride_om, stride_on,
        HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
        GATED: tl.constexpr, SPLIT: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        USE_PDL: tl.constexpr = False):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    dtype = x_ptr.dtype.element_ty
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    x_rows = x_ptr + m[:, None] * stride_xm
    k_lo = pid_k * k_per_split
    if USE_PDL:
        # The weights are no earlier kernel's output: the first K tile's loads go out while the
        # kernel before this one drains, and the loop below starts one tile later. x, the norm
        # weight's partner statistics, the residual and every output wait for it.
        first_kk = k_lo + tl.arange(0, BLOCK_K)
        first_ok = first_kk < K
        first_w = _weights(w_ptr, n, n_ok, first_kk, first_ok, stride_wn, stride_wk)
        if GATED:
            first_w_up = _weights(w_ptr, n + up_offset, n_ok, first_kk, first_ok, stride_wn,
                                  stride_wk)
        else:
            first_w_up = first_w
        pdl_wait()
        pdl_launch_dependents()

    rstd = _row_rstd(x_rows, m_ok, K, eps, stride_xk, HAS_NORM, BLOCK_M, BLOCK_K)

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # One row of x (M = 1): products accumulate elementwise over the K tiles and are reduced
    # across lanes once, after the loop, instead of once per tile.
    wide = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    wide_up = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    loop_lo = k_lo
    if USE_PDL:
        acc, acc_up, wide, wide_up = _tile(
            acc, acc_up, wide, wide_up, first_w, first_w_up, x_rows, m_ok, first_kk, first_ok,
            norm_ptr, rstd, stride_xk, dtype, HAS_NORM, GATED, BLOCK_M, BLOCK_K)
        loop_lo = k_lo + BLOCK_K
    for k0 in range(loop_lo, k_lo + k_per_split, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < K
        w = _weights(w_ptr, n, n_ok, kk, k_ok, stride_wn, stride_wk)
        if GATED:
            w_up = _weights(w_ptr, n + up_offset, n_ok, kk, k_ok, stride_wn, stride_wk)
        else:
            w_up = w
        acc, acc_up, wide, wide_up = _tile(
            acc, acc_up, wide, wide_up, w, w_up, x_rows, m_ok, kk, k_ok, norm_ptr, rstd,
            stride_xk, dtype, HAS_NORM, GATED, BLOCK_M, BLOCK_K)
    if BLOCK_M == 1:
        acc = tl.sum(wide, axis=1)[None, :]
        acc_up = tl.sum(wide_up, axis=1)[None, :]

    _write_result(acc, acc_up, pid_k, m, m_ok, n, n_ok, M, N, up_offset, part_ptr, bias_ptr,
                  res_ptr, out_ptr, stride_rm, stride_rn, stride_om, stride_on, HAS_BIAS,
                  HAS_RESIDUAL, GATED, SPLIT)


@triton.jit
def _weights_t(w_ptr, rows, rows_ok, kk, k_ok, stride_wn, stride_wk):
    """W[rows, kk]^T as a [BLOCK_K, BLOCK_N] tile in the weights' own dtype (0 outside)."""
    return tl.load(w_ptr + rows[None, :] * stride_wn + kk[:, None] * stride_wk,
                   mask=rows_ok[None, :] & k_ok[:, None], other=0.0)


@triton.jit
def _dot(a, b, acc, INTERPRETED: tl.constexpr):
    """acc + a @ b, 16-bit operands. Triton's interpreter (3.6) multiplies bf16 operands' bits as
    integers, so there the operands go up to fp32 first: the same exact products."""
    if INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _gemv_mma_kernel(
        x_ptr, w_ptr, bias_ptr, res_ptr, norm_ptr, out_ptr, part_ptr,
        M, N, K, k_per_split, up_offset, eps,
        stride_xm, stride_xk, stride_wn, stride_wk, stride_rm, stride_rn, stride_om, stride_on,
        HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
        GATED: tl.constexpr, SPLIT: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        INTERPRETED: tl.constexpr, PREFETCH_K: tl.constexpr = 0, USE_PDL: tl.constexpr = False):
    """`_gemv_kernel`'s contract with the products on tensor cores: x padded to BLOCK_M >= 16
    rows (zeros), W's tiles fed to `tl.dot`, so that Triton's pipeliner streams them through
    shared memory `num_stages` tiles ahead: more bytes in flight per SM than loads into
    registers keep. Products of 16-bit values are exact in fp32 and summed in fp32, as there."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    dtype = x_ptr.dtype.element_ty
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    x_rows = x_ptr + m[:, None] * stride_xm
    k_lo = pid_k * k_per_split
    if USE_PDL:
        # The weights are no earlier kernel's output: the first PREFETCH_K columns of this
        # program's rows go to L2 while the kernel before drains. x, the residual and the outputs
        # wait for it.
        if PREFETCH_K > 0:
            item_bytes = w_ptr.dtype.element_ty.primitive_bitwidth // 8
            row_bytes = tl.minimum(PREFETCH_K, K - k_lo) * item_bytes
            prefetch_rows_to_l2(w_ptr + n * stride_wn + k_lo, n_ok, row_bytes)
            if GATED:
                prefetch_rows_to_l2(w_ptr + (n + up_offset) * stride_wn + k_lo, n_ok, row_bytes)
        pdl_wait()
        pdl_launch_dependents()
    rstd = _row_rstd(x_rows, m_ok, K, eps, stride_xk, HAS_NORM, BLOCK_M, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_lo + k_per_split, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < K
        xv = _x_tile(x_rows, m_ok, kk, k_ok, norm_ptr, rstd, stride_xk, dtype, HAS_NORM)
        w = _weights_t(w_ptr, n, n_ok, kk, k_ok, stride_wn, stride_wk)
        acc = _dot(xv, w, acc, INTERPRETED)
        if GATED:
            w_up = _weights_t(w_ptr, n + up_offset, n_ok, kk, k_ok, stride_wn, stride_wk)
            acc_up = _dot(xv, w_up, acc_up, INTERPRETED)
    _write_result(acc, acc_up, pid_k, m, m_ok, n, n_ok, M, N, up_offset, part_ptr, bias_ptr,
                  res_ptr, out_ptr, stride_rm, stride_rn, stride_om, stride_on, HAS_BIAS,
                  HAS_RESIDUAL, GATED, SPLIT)


@triton.jit
def _split_sum_kernel(part_ptr, bias_ptr, res_ptr, out_ptr, M, N,
                      stride_rm, stride_rn, stride_om, stride_on,
                      SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_PDL: tl.constexpr = False):
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    if USE_PDL:
        # Everything this kernel reads but the bias is the GEMV kernel's output or earlier.
        pdl_wait()
        pdl_launch_dependents()
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):  # a fixed order: the same sum at every launch
        acc += tl.load(part_ptr + (s * M + m[:, None]) * N + n[None, :],
                       mask=m_ok[:, None] & n_ok[None, :], other=0.0)
    _finish(acc, acc, m, m_ok, n, n_ok, 0, bias_ptr, res_ptr, out_ptr, stride_rm, stride_rn,
            stride_om, stride_on, HAS_BIAS, HAS_RESIDUAL, False)


SPLIT_SUM_BLOCK = 256
SIXTEEN_BIT = (torch.bfloat16, torch.float16)


def _rows_prefetchable(weight: torch.Tensor) -> bool:
    """Whether every row of W starts 16-byte aligned with contiguous columns (and so every prefetch
    of whole 16-byte pieces from a row's tile start is valid): otherwise the kernel prefetches
    nothing (its results are the same; only the loads before the PDL wait are lost)."""
    row_bytes = weight.stride(0) * weight.element_size()
    return weight.stride(1) == 1 and weight.data_ptr() % 16 == 0 and row_bytes % 16 == 0


def gemv_triton(x: torch.Tensor, weight: torch.Tensor, *, bias: torch.Tensor | None = None,
                residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
                eps: float = 0.0, gated: bool = False,
                config: GemvConfig | None = None, pdl: bool = False) -> torch.Tensor:
    """y [M, N] = (rms_norm(x) if norm_weight is given, else x) [M, K] @ weight[N, K]^T (+ bias)
    (+ residual [M, N]); `gated`: weight is [2N, K], gate rows then up rows, and
    y = silu(gate) * up. `config` None: `choose_gemv_config` for the shapes and device. `pdl`:
    both kernels are launched with Programmatic Dependent Launch (triton_pdl.py), the GEMV
    loading its first weight tile (row tiles) or prefetching its rows' first `config.prefetch_k`
    columns into L2 (tensor cores) before it waits for the kernel before it."""
    launch = pdl_launch_options(pdl)
    rows_m, k = x.shape
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    out = torch.empty((rows_m, n), dtype=x.dtype, device=x.device)
    if rows_m == 0 or n == 0:
        return out
    if config is None:
        config = choose_gemv_config(rows_m, n, k, sms=sm_count(x.device),
                                    rows_per_output=2 if gated else 1,
                                    tensor_cores=x.dtype in SIXTEEN_BIT)
    if config.mma and x.dtype not in SIXTEEN_BIT:
        raise ValueError(f"the tensor-core GEMV ({config.label()}) takes bf16 or fp16 operands, "
                         f"got {x.dtype}")
    if config.mma and rows_m > MMA_MAX_ROWS:
        raise ValueError(f"the tensor-core GEMV ({config.label()}) takes at most {MMA_MAX_ROWS} "
                         f"rows of x, got {rows_m}")
    if gated and config.split_k > 1:
        raise ValueError(f"the gated GEMV does not split K (its epilogue needs whole sums), got "
                         f"{config.label()}")
    tiles = triton.cdiv(k, config.block_k)
    k_per_split = triton.cdiv(tiles, config.split_k) * config.block_k
    split = triton.cdiv(k, k_per_split)
    partials = (torch.empty((split, rows_m, n), dtype=torch.float32, device=x.device)
                if split > 1 else out)
    # Absent operands get a stand-in pointer: their loads are compiled out (constexpr flags).
    res = residual if residual is not None else out
    bm = MMA_MAX_ROWS if config.mma else block_m(rows_m)
    kernel, extra = _gemv_kernel, {}
    if config.mma:
        # A CPU tensor reaches a launcher only under Triton's interpreter.
        kernel, extra = _gemv_mma_kernel, {"INTERPRETED": not x.is_cuda}
        if pdl and x.is_cuda and config.prefetch_k and k % 8 == 0 and _rows_prefetchable(weight):
            extra["PREFETCH_K"] = min(config.prefetch_k, k_per_split)
    kernel[(triton.cdiv(n, config.block_n), split)](
        x, weight, bias if bias is not None else x, res,
        norm_weight if norm_weight is not None else x, out, partials,
        rows_m, n, k, k_per_split, n if gated else 0, eps,
        *x.stride(), *weight.stride(), *res.stride(), *out.stride(),
        HAS_NORM=norm_weight is not None, HAS_BIAS=bias is not None,
        HAS_RESIDUAL=residual is not None, GATED=gated, SPLIT=split > 1,
        BLOCK_M=bm, BLOCK_N=config.block_n, BLOCK_K=config.block_k, num_warps=config.num_warps,
        num_stages=config.num_stages, **extra, **launch)
    if split > 1:
        _split_sum_kernel[(triton.cdiv(n, SPLIT_SUM_BLOCK),)](
            partials, bias if bias is not None else x, res, out, rows_m, n,
            *res.stride(), *out.stride(),
            SPLIT_K=split, HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None,
            BLOCK_M=bm, BLOCK_N=SPLIT_SUM_BLOCK, num_warps=4, **launch)
    return out
