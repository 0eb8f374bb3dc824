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

from harness.ops.decode_kernel import triton_blocker

ROPE_KV_WRITES = ("separate", "fused")


@dataclass(frozen=True)
class RopeKvChoice:
    """`mode` (one of ROPE_KV_WRITES) for a request of `requested` (None: not given), `reason` in
    words; `fell_back` when CUDA wanted the fused kernel and could not have triton."""

    requested: str | None
    mode: str
    reason: str
    fell_back: bool = False


def choose_rope_kv_write(requested: str | None, device: torch.device | str) -> RopeKvChoice:
    """The rope + KV-write mode for a model on `device`. None picks "fused" on a real CUDA device
    where triton imports, else "separate"; an explicit "fused" on CUDA without triton is refused
    (its CUDA kernel is a Triton kernel), anywhere else it runs the op's torch implementation."""
    if requested is not None and requested not in ROPE_KV_WRITES:
        raise ValueError(f"rope_kv_write must be one of {list(ROPE_KV_WRITES)} or None (choose for "
                         f"the device), got {requested!r}")
    if requested == "separate":
        return RopeKvChoice(requested, "separate", "requested")
    device = torch.device(device)
    blocker, missing_triton = triton_blocker(device)
    if blocker is None:
        return RopeKvChoice(requested, "fused", "requested" if requested else "CUDA device with triton")
    if requested == "fused":
        if missing_triton:
            raise ValueError(f"rope_kv_write='fused' cannot run here: {blocker}; ask for "
                             f"rope_kv_write='separate' or None (choose for the device)")
        return RopeKvChoice(requested, "fused", f"requested; {blocker}")
    return RopeKvChoice(requested, "separate", blocker, fell_back=missing_triton)
