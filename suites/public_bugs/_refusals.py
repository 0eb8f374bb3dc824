"""What a test of a refused capture needs after the refusal."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def stream_kept():
    """For a capture CUDA refuses inside `torch.cuda.graph`: the block's exit stops at the failed
    `capture_end()` before it leaves the capture's stream context (torch/cuda/graphs.py), so the
    capture's stream stays current, on CUDA as on the emulated device. The caller's stream is
    made current again, as a program that goes on after the refusal must do."""
    stream = torch.cuda.current_stream()
    try:
        yield
    finally:
        torch.cuda.set_stream(stream)
