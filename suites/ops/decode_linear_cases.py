"""Operands of the decode GEMV ops (harness/ops/decode_linear.py), their float64 references and a
capture-and-replay helper, shared by the torch-path and the Triton tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.ops.decode_linear import gemv_residual_op, norm_gemv_op, norm_gemv_silu_mul_op

OPS = ("norm_gemv", "gemv_residual", "norm_gemv_silu_mul")
EPS = 1e-5


@dataclass(frozen=True)
class GemvCase:
    """x [m, k], weight [rows, k] (rows = 2n for the gated op), norm weight [k], bias [rows] or
    None, residual [m, n]; values of a layer's scale (weights ~ 1/sqrt(k))."""

    op: str
    x: torch.Tensor
    weight: torch.Tensor
    norm_weight: torch.Tensor
    bias: torch.Tensor | None
    residual: torch.Tensor

    def args(self) -> tuple:
        if self.op == "gemv_residual":
            return self.x, self.weight, self.bias, self.residual
        return self.x, self.norm_weight, EPS, self.weight, self.bias

    def run_op(self) -> torch.Tensor:
        return {"norm_gemv": norm_gemv_op, "gemv_residual": gemv_residual_op,
                "norm_gemv_silu_mul": norm_gemv_silu_mul_op}[self.op](*self.args())

    def copy_from(self, other: GemvCase) -> None:
        for mine, theirs in ((self.x, other.x), (self.weight, other.weight),
                             (self.norm_weight, other.norm_weight), (self.residual, other.residual),
                             (self.bias, other.bias)):
            if mine is not None:
                mine.copy_(theirs)


def gemv_case(op: str, m: int = 1, n: int = 48, k: int = 96, *, bias: bool = False,
              dtype: torch.dtype = torch.bfloat16, device: str = "cpu", seed: int = 0) -> GemvCase:
    gen = torch.Generator().manual_seed(seed)
    rows = 2 * n if op == "norm_gemv_silu_mul" else n

    def rand(*shape, scale=1.0, shift=0.0):
        return (torch.randn(shape, generator=gen) * scale + shift).to(dtype).to(device)

    return GemvCase(op, x=rand(m, k, scale=2.0), weight=rand(rows, k, scale=k ** -0.5),
                    norm_weight=rand(k, scale=0.2, shift=1.0),
                    bias=rand(rows, scale=0.5) if bias else None, residual=rand(m, n))


def float64_result(case: GemvCase) -> torch.Tensor:
    """The op's value with every step in float64 (no intermediate rounding): the oracle both
    implementations are held to within a few BF16 steps."""
    x, w = case.x.double().cpu(), case.weight.double().cpu()
    b = None if case.bias is None else case.bias.double().cpu()
    if case.op == "gemv_residual":
        y = x @ w.T + case.residual.double().cpu()
        return y if b is None else y + b
    h = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * case.norm_weight.double().cpu()
    y = h @ w.T if b is None else h @ w.T + b
    if case.op == "norm_gemv":
        return y
    gate, up = y.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def steps_off(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest difference in BF16 steps of the result's magnitude (one step: eps * max |y|)."""
    scale = torch.finfo(torch.bfloat16).eps * max(want.abs().max().item(), 1.0)
    return (got.double().cpu() - want.double().cpu()).abs().max().item() / scale


def replay_on_a_later_case(first: GemvCase, later: GemvCase) -> torch.Tensor:
    """Capture the op on `first` (after one launch outside capture, as a runtime warms up), copy
    `later`'s values into the captured inputs, replay: the captured output then holds the op's
    value on `later`."""
    first.run_op()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = first.run_op()
    first.copy_from(later)
    graph.replay()
    torch.cuda.synchronize()
    return out
