"""How a layer's rotary embedding and KV-cache write run: "fused" (one op, `harness::rope_kv_write`,
before the attention op, which then finds the cache written) or "separate" (rope in the model's
torch ops, the K/V write inside the attention op).

`choose_rope_kv_write` turns a request (None: choose for the device) into a `RopeKvChoice` that
names the mode and why; the engine keeps it as `Engine.rope_kv_write` and counts a fallback when
CUDA has to do without triton. "fused" is right on every device (its torch implementation serves
the CPU and the emulated CUDA device); only on real CUDA does it need triton.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.ops.fused_choice import FUSED_MODES, FusedModeChoice, choose_fused_mode

ROPE_KV_WRITES = FUSED_MODES


@dataclass(frozen=True)
class RopeKvChoice(FusedModeChoice):
    """The rope + KV-write mode chosen, and why (fields as `FusedModeChoice`)."""


def choose_rope_kv_write(requested: str | None, device: torch.device | str) -> RopeKvChoice:
    """The rope + KV-write mode for a model on `device`. None picks "fused" on a real CUDA device
    where triton imports, else "separate"; an explicit "fused" on CUDA without triton is refused
    (its CUDA kernel is a Triton kernel), anywhere else it runs the op's torch implementation."""
    return choose_fused_mode("rope_kv_write", requested, device, RopeKvChoice)
