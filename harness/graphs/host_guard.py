"""Host reads that never reach the dispatcher on CPU (`tolist`, `numpy`, printing) would slip past
a TorchDispatchMode; while the emulator captures, these Tensor methods raise instead."""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator

import torch

from harness.graphs.base import CaptureError
from harness.graphs.callsite import at_callsite, current_callsite

_GUARDED = ("tolist", "numpy", "__repr__", "__format__", "__array__")


def _guarded(name: str, original: Callable, device: torch.device) -> Callable:
    @functools.wraps(original)
    def guard(self: torch.Tensor, *args, **kwargs):
        if self.device.type == device.type:
            raise CaptureError(at_callsite(
                f"Tensor.{name} reads {self.device} data on the host during capture (a sync); "
                f"move it out of the captured region", current_callsite()), op=f"Tensor.{name}")
        return original(self, *args, **kwargs)
    return guard


@contextlib.contextmanager
def host_reads_raise(device: torch.device) -> Iterator[None]:
    """Make host reads of `device` tensors raise `CaptureError` for the duration."""
    saved = {name: torch.Tensor.__dict__.get(name) for name in _GUARDED}
    try:
        for name in _GUARDED:
            setattr(torch.Tensor, name, _guarded(name, getattr(torch.Tensor, name), device))
        yield
    finally:
        for name, original in saved.items():
            if original is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)
