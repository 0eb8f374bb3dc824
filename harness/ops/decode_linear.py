"""The decode GEMVs of a Llama layer as three ops, each one kernel on CUDA where the separate path
runs a GEMM and the norm, residual or activation kernels around it:

- `harness::norm_gemv(x, norm_weight, eps, weight, bias)`: linear(rms_norm(x)) (qkv_proj after
  input_layernorm; the model keeps the final norm + lm_head on the torch ops, where cuBLAS is
  faster);
- `harness::gemv_residual(x, weight, bias, residual)`: residual + linear(x) (o_proj, down_proj:
  the residual add the separate path folds into the GEMM as beta = 1);
- `harness::norm_gemv_silu_mul(x, norm_weight, eps, weight, bias)`: silu(gate) * up of
  linear(rms_norm(x)) with the fused gate_up weight as the model lays it out, gate rows [0, I)
  then up rows [I, 2I) (gate_up_proj after post_attention_layernorm).

x is [M, K], weight [N, K] as `nn.Linear` holds it; each returns a new [M, N] tensor (the residual
stream the layer carries on is the output of `gemv_residual`; the norms' outputs are consumed
inside). The implementations:

- CUDA: the Triton kernels of `triton_gemv.py`, imported on the first CUDA call so that installs
  without triton never import it; their launch config comes from the shapes (`gemv_configs.py`),
  never from a benchmark, so a capture launches exactly what the warmup launched.
- every other device (the CPU; the emulated CUDA device, whose device tensors are CPU tensors): the
  torch ops of the separate path (`F.rms_norm`, `F.linear`, `addmm`, `F.silu`), bit for bit what
  the model computes without the ops, and the kernels' reference.
- fake: an empty [M, N] of x's dtype, so dynamo and inductor keep each op as one opaque call.

Each op takes `pdl` last (default False): on CUDA its kernels are launched with Programmatic
Dependent Launch (`pdl_choice.py`); the torch implementations have no launches and ignore it.

The kernels are right for any M; they are fast for decode-sized M, so the model calls them only
there (`decode_linear_choice.py` says when).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def _rms_norm(x: torch.Tensor, norm_weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, norm_weight.shape, norm_weight, eps)


def _norm_gemv_torch(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                     bias: Optional[torch.Tensor], pdl: bool = False) -> torch.Tensor:
    return F.linear(_rms_norm(x, norm_weight, eps), weight, bias)


def _gemv_residual_torch(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                         residual: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    out = torch.addmm(residual, x, weight.t())
    return out if bias is None else out.add_(bias)


def _norm_gemv_silu_mul_torch(x: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                              weight: torch.Tensor, bias: Optional[torch.Tensor],
                              pdl: bool = False) -> torch.Tensor:
    gate, up = F.linear(_rms_norm(x, norm_weight, eps), weight, bias).chunk(2, dim=-1)
    return F.silu(gate) * up


norm_gemv_op = torch.library.custom_op("harness::norm_gemv", mutates_args=())(_norm_gemv_torch)
gemv_residual_op = torch.library.custom_op("harness::gemv_residual",
                                           mutates_args=())(_gemv_residual_torch)
norm_gemv_silu_mul_op = torch.library.custom_op("harness::norm_gemv_silu_mul",
                                                mutates_args=())(_norm_gemv_silu_mul_torch)


@norm_gemv_op.register_kernel("cuda")
def _(x, norm_weight, eps, weight, bias, pdl=False):
    from harness.ops.triton_gemv import gemv_triton

    return gemv_triton(x, weight, bias=bias, norm_weight=norm_weight, eps=eps, pdl=pdl)


@gemv_residual_op.register_kernel("cuda")
def _(x, weight, bias, residual, pdl=False):
    from harness.ops.triton_gemv import gemv_triton

    return gemv_triton(x, weight, bias=bias, residual=residual, pdl=pdl)


@norm_gemv_silu_mul_op.register_kernel("cuda")
def _(x, norm_weight, eps, weight, bias, pdl=False):
    from harness.ops.triton_gemv import gemv_triton

    return gemv_triton(x, weight, bias=bias, norm_weight=norm_weight, eps=eps, gated=True, pdl=pdl)


@norm_gemv_op.register_fake
def _(x, norm_weight, eps, weight, bias, pdl=False):
    return x.new_empty((x.shape[0], weight.shape[0]))


@gemv_residual_op.register_fake
def _(x, weight, bias, residual, pdl=False):
    return residual.new_empty((x.shape[0], weight.shape[0]))


@norm_gemv_silu_mul_op.register_fake
def _(x, norm_weight, eps, weight, bias, pdl=False):
    return x.new_empty((x.shape[0], weight.shape[0] // 2))


def _check(op: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           out_features: int) -> None:
    """Host-side shape checks (shapes only: capture-safe); the ops trust their callers."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"{op}: x must be [tokens, K] and weight [N, K] with one K, got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    if x.dtype != weight.dtype:
        raise ValueError(f"{op}: x dtype {x.dtype} must be the weight's {weight.dtype}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"{op}: bias {tuple(bias.shape)} must be [{weight.shape[0]}]")
    if out_features < 1:
        raise ValueError(f"{op}: weight {tuple(weight.shape)} gives {out_features} outputs")


def _check_norm(op: str, x: torch.Tensor, norm_weight: torch.Tensor) -> None:
    if norm_weight.shape != (x.shape[1],):
        raise ValueError(f"{op}: norm_weight {tuple(norm_weight.shape)} must be [{x.shape[1]}] "
                         f"(x's K)")


def norm_gemv(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
              bias: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """Checked call of `harness::norm_gemv`: linear(rms_norm(x) * norm_weight), [M, N]."""
    _check("norm_gemv", x, weight, bias, weight.shape[0])
    _check_norm("norm_gemv", x, norm_weight)
    return norm_gemv_op(x, norm_weight, eps, weight, bias, pdl)


def gemv_residual(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  residual: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """Checked call of `harness::gemv_residual`: residual + linear(x), a new [M, N] tensor."""
    _check("gemv_residual", x, weight, bias, weight.shape[0])
    if residual.shape != (x.shape[0], weight.shape[0]) or residual.dtype != x.dtype:
        raise ValueError(f"gemv_residual: residual {tuple(residual.shape)} {residual.dtype} must be "
                         f"[{x.shape[0]}, {weight.shape[0]}] {x.dtype}")
    return gemv_residual_op(x, weight, bias, residual, pdl)


def norm_gemv_silu_mul(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                       bias: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """Checked call of `harness::norm_gemv_silu_mul`: silu(gate) * up, [M, N / 2], from the fused
    weight [2I, K] (gate rows first)."""
    if weight.dim() == 2 and weight.shape[0] % 2:
        raise ValueError(f"norm_gemv_silu_mul: weight {tuple(weight.shape)} must have an even number "
                         f"of rows (gate rows, then as many up rows)")
    _check("norm_gemv_silu_mul", x, weight, bias, weight.shape[0] // 2)
    _check_norm("norm_gemv_silu_mul", x, norm_weight)
    return norm_gemv_silu_mul_op(x, norm_weight, eps, weight, bias, pdl)
