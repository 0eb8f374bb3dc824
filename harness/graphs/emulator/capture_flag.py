"""What code that asks whether it is being captured sees during an emulated capture.

transformers (`is_tracing`), vLLM and FlashInfer skip host-side checks while
`torch.cuda.is_current_stream_capturing()` is true; the emulator stands for CUDA, so it answers true
for the duration of a capture, on every device, and restores the original afterwards."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.cuda.graphs

# Callers reach the function through either module; both names are patched.
_MODULES = (torch.cuda, torch.cuda.graphs)
_NAME = "is_current_stream_capturing"


def _capturing() -> bool:
    return True


@contextlib.contextmanager
def reports_capturing() -> Iterator[None]:
    """`torch.cuda.is_current_stream_capturing()` answers True inside, its own answer after."""
    saved = [(module, module.__dict__[_NAME]) for module in _MODULES]
    try:
        for module, _ in saved:
            setattr(module, _NAME, _capturing)
        yield
    finally:
        for module, original in saved:
            setattr(module, _NAME, original)
