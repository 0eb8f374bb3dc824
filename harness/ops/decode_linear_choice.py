"""How a layer's linear layers run for decode-sized batches: "fused" (the three decode GEMV ops of
`decode_linear.py`, each carrying the norm, residual add or SiLU-and-multiply next to it; the
final norm + lm_head stay on the torch ops, where cuBLAS is faster) or "separate" (the model's
torch ops: norm, GEMM, activation).

Only batches of at most `DECODE_LINEAR_MAX_TOKENS` token rows take the fused ops
(`uses_decode_linear`); larger ones (prefill, big decode batches) stay on torch's matmul, where a
GEMM kernel, not a GEMV, is the right tool. The piecewise prefill graphs, whose token count is
dynamic, never take them.

`choose_decode_linear` turns a request (None: choose for the device) into a `DecodeLinearChoice`
that names the mode and why; the engine keeps it as `Engine.decode_linear` and counts a fallback
when CUDA has to do without triton. "fused" is right on every device (its torch implementation
serves the CPU and the emulated CUDA device, bit for bit the separate path there); only on real
CUDA does it need triton.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.ops.fused_choice import FUSED_MODES, FusedModeChoice, choose_fused_mode

DECODE_LINEARS = FUSED_MODES
# The largest batch (token rows) the GEMV kernels serve; each program carries every row of x.
DECODE_LINEAR_MAX_TOKENS = 8


@dataclass(frozen=True)
class DecodeLinearChoice(FusedModeChoice):
    """The decode-linear mode chosen, and why (fields as `FusedModeChoice`)."""


def uses_decode_linear(mode: str, num_tokens: int) -> bool:
    """Whether a forward of `num_tokens` rows (padding included) runs the fused decode GEMVs."""
    return mode == "fused" and num_tokens <= DECODE_LINEAR_MAX_TOKENS


def choose_decode_linear(requested: str | None, device: torch.device | str) -> DecodeLinearChoice:
    """The decode-linear mode for a model on `device`. None picks "fused" on a real CUDA device
    where triton imports, else "separate"; an explicit "fused" on CUDA without triton is refused
    (its CUDA kernels are Triton kernels), anywhere else it runs the ops' torch implementation."""
    return choose_fused_mode("decode_linear", requested, device, DecodeLinearChoice)
