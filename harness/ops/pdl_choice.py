"""Whether the project's Triton decode kernels (the decode GEMVs, the rope + KV write, the paged
decode attention) are launched with Programmatic Dependent Launch (triton_pdl.py): each may then
start while the kernel before it drains, and waits on it before reading its output.

`choose_pdl` turns a request (None: choose for the device) into a `PdlChoice` that says whether
and why; the engine keeps it as `Engine.pdl`, carries it in the attention metadata to the ops, and
counts a fallback where a Hopper-class CUDA device has to do without it because the installed
triton lacks the intrinsics. PDL needs compute capability 9.0 or later (Hopper) and a triton with
`triton.language.extra.cuda.gdc_wait` / `gdc_launch_dependents` and the `launch_pdl` launch option.
The ops' torch implementations (the CPU, the emulated CUDA device) have no launches to change and
ignore it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.ops import pdl_support
from harness.ops.decode_kernel import triton_blocker

PDL_MIN_CAPABILITY = (9, 0)


@dataclass(frozen=True)
class PdlChoice:
    """`enabled` for a request of `requested` (None: not given), `reason` in words; `fell_back`
    when a CUDA device able to run PDL could not, for want of a triton that has it."""

    requested: bool | None
    enabled: bool
    reason: str
    fell_back: bool = False


def pdl_blocker(device: torch.device) -> tuple[str | None, bool]:
    """Why the Triton kernels cannot be launched with PDL on `device` (None: they can), and
    whether that is the installed triton's doing on a device that could (a fallback)."""
    blocker, missing_triton = triton_blocker(device)
    if blocker is not None:
        capable = missing_triton and _capability(device) >= PDL_MIN_CAPABILITY
        return f"PDL launches Triton kernels: {blocker}", capable
    capability = _capability(device)
    if capability < PDL_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return (f"{name} has compute capability {capability[0]}.{capability[1]}; PDL needs "
                f"{PDL_MIN_CAPABILITY[0]}.{PDL_MIN_CAPABILITY[1]} or later"), False
    missing = pdl_support.pdl_missing()
    if missing is not None:
        return missing, True
    return None, False


def choose_pdl(requested: bool | None, device: torch.device | str) -> PdlChoice:
    """PDL for a model on `device`. None turns it on where it can run (a real CUDA device of
    compute capability >= 9.0 with a triton that has it), else off; True where it cannot run is
    refused, naming the missing piece; False is off."""
    if requested is not None and not isinstance(requested, bool):
        raise ValueError(f"pdl must be True, False or None (choose for the device), got "
                         f"{requested!r}")
    if requested is False:
        return PdlChoice(requested, False, "requested")
    blocker, fell_back = pdl_blocker(torch.device(device))
    if blocker is None:
        return PdlChoice(requested, True, "requested" if requested else
                         "CUDA device of compute capability >= 9.0 with a triton that has PDL")
    if requested:
        raise ValueError(f"pdl=True cannot run here: {blocker}; ask for pdl=False or None "
                         f"(choose for the device)")
    return PdlChoice(requested, False, blocker, fell_back=fell_back)


def _capability(device: torch.device) -> tuple[int, int]:
    if device.type != "cuda" or not torch.cuda.is_available():
        return (0, 0)
    return tuple(torch.cuda.get_device_capability(device))
