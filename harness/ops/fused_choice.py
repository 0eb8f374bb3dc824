"""The choice between an op's "fused" path (a Triton kernel on real CUDA, the op's torch
implementation everywhere else) and its "separate" path (the model's torch ops), shared by every
option that has those two modes (`decode_linear`, `rope_kv_write`).

A request of None chooses for the device: "fused" on a real CUDA device where triton imports, else
"separate", counted as a fallback (`fell_back`) only where CUDA had to do without triton. An
explicit "fused" runs anywhere its torch implementation serves and is refused on CUDA without
triton, whose fused kernels are Triton kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.ops.decode_kernel import triton_blocker

FUSED_MODES = ("separate", "fused")


@dataclass(frozen=True)
class FusedModeChoice:
    """`mode` (one of FUSED_MODES) for a request of `requested` (None: not given), `reason` in
    words; `fell_back` when CUDA wanted the fused kernels and could not have triton."""

    requested: str | None
    mode: str
    reason: str
    fell_back: bool = False


def choose_fused_mode(option: str, requested: str | None, device: torch.device | str,
                      choice_type: type[FusedModeChoice] = FusedModeChoice) -> FusedModeChoice:
    """The mode of `option` (the config field's name, used in every message) for a model on
    `device`, as a `choice_type`."""
    if requested is not None and requested not in FUSED_MODES:
        raise ValueError(f"{option} must be one of {list(FUSED_MODES)} or None (choose for "
                         f"the device), got {requested!r}")
    if requested == "separate":
        return choice_type(requested, "separate", "requested")
    blocker, missing_triton = triton_blocker(torch.device(device))
    if blocker is None:
        return choice_type(requested, "fused", "requested" if requested else "CUDA device with triton")
    if requested == "fused":
        if missing_triton:
            raise ValueError(f"{option}='fused' cannot run here: {blocker}; ask for "
                             f"{option}='separate' or None (choose for the device)")
        return choice_type(requested, "fused", f"requested; {blocker}")
    return choice_type(requested, "separate", blocker, fell_back=missing_triton)
