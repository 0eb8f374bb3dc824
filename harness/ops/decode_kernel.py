"""Which implementation serves the attention of decode-only batches: "triton" (the paged-decode
kernel, `harness::paged_decode_attention`, reading the cache through the block table) or "torch"
(the gather and dense GEMMs of `harness::paged_attention`, the path for every other batch).

`choose_decode_kernel` turns a request (None: choose for the device) into a `DecodeKernelChoice`
that names the kernel and why, so the choice is visible wherever it is reported (the engine keeps
it as `Engine.decode_kernel`, and counts a fallback when CUDA has to do without triton).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

DECODE_KERNELS = ("torch", "triton")


@dataclass(frozen=True)
class DecodeKernelChoice:
    """`kernel` (one of DECODE_KERNELS) for a request of `requested` (None: not given), `reason`
    in words; `fell_back` when CUDA wanted triton and could not have it."""

    requested: str | None
    kernel: str
    reason: str
    fell_back: bool = False


@functools.cache
def triton_import_error() -> str | None:
    """Why triton cannot be imported here (None: it can). Asked once per process."""
    try:
        import triton  # noqa: F401
    except Exception as error:  # a broken install raises more than ImportError
        return f"{type(error).__name__}: {error}"
    return None


def choose_decode_kernel(requested: str | None, device: torch.device | str) -> DecodeKernelChoice:
    """The decode kernel for a model on `device`. None picks triton on a real CUDA device where
    triton imports, else torch; an explicit "triton" where it cannot run is refused."""
    if requested is not None and requested not in DECODE_KERNELS:
        raise ValueError(f"decode_kernel must be one of {list(DECODE_KERNELS)} or None (choose for "
                         f"the device), got {requested!r}")
    if requested == "torch":
        return DecodeKernelChoice(requested, "torch", "requested")
    device = torch.device(device)
    blocker, missing_triton = triton_blocker(device)
    if blocker is None:
        return DecodeKernelChoice(requested, "triton", "requested" if requested else
                                  "CUDA device with triton")
    if requested == "triton":
        raise ValueError(f"decode_kernel='triton' cannot run here: {blocker}; ask for "
                         f"decode_kernel='torch' or None (choose for the device)")
    return DecodeKernelChoice(requested, "torch", blocker, fell_back=missing_triton)


def triton_blocker(device: torch.device) -> tuple[str | None, bool]:
    """Why the Triton kernel cannot serve a model on `device` (None: it can), and whether that is
    a real CUDA device lacking triton (the one case that is a fallback, not the device's nature)."""
    if device.type != "cuda":
        return f"the device is {device.type}, the kernel runs on CUDA", False
    from harness.emulation import emulation_active

    if emulation_active() == "cpu":
        return ("the emulated CUDA device holds CPU tensors, which run the torch-ops "
                "implementation"), False
    error = triton_import_error()
    if error is not None:
        return f"triton is not importable ({error})", True
    return None, False
