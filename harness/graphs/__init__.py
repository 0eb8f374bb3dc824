"""Graph backends behind one contract (docs/design.md, "The graph backend contract"): real CUDA
graphs and an emulator with the same semantics on CPU. Imports only torch (and the backend names
from harness.records)."""

from __future__ import annotations

import torch

from harness.graphs.base import (CaptureDependencyError, CaptureError,
                                 CaptureInvalidatedError, CaptureSyncError, CapturedGraph,
                                 FreedMemoryError, GraphBackend, StorageChangedError)
from harness.records import BACKENDS


def resolve_backend(name: str) -> str:
    """The backend "auto" stands for on this machine (cuda when available, else emulated); other
    names stand for themselves."""
    if name not in BACKENDS:
        raise ValueError(f"unknown graph backend {name!r}; expected one of {', '.join(BACKENDS)}")
    if name == "auto":
        from harness.emulation import emulation_active

        # Inside emulate_cuda() torch.cuda's graphs are the emulator's (the emulated device, or the
        # sanitizer on a GPU), whatever is_available() answers.
        return "cuda" if torch.cuda.is_available() and emulation_active() is None else "emulated"
    return name


def get_backend(name: str = "auto", device: torch.device | str | None = None) -> GraphBackend:
    """"cuda" (real CUDA graphs), "emulated" (CPU by default; `device` may name another), or
    "auto": cuda when available, else emulated."""
    if resolve_backend(name) == "cuda":
        from harness.graphs.cuda import CudaBackend

        return CudaBackend(device)
    from harness.graphs.emulated import EmulatedBackend

    return EmulatedBackend(device)


__all__ = ["BACKENDS", "CaptureDependencyError", "CaptureError", "CaptureInvalidatedError",
           "CaptureSyncError", "CapturedGraph", "FreedMemoryError", "GraphBackend",
           "StorageChangedError", "get_backend", "resolve_backend"]
