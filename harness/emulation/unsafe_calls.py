"""CUDA's rule for a potentially unsafe call (one that allocates or synchronizes: cublasCreate,
cudaHostAlloc, cudaMalloc) made while a stream capture is under way, by its cudaStreamCaptureMode:
refused in "global" mode from every thread of the process, in "thread_local" mode from the thread
that began the capture only, never in "relaxed" mode. A refused call invalidates the capture, so
capture_end() then fails with "operation failed due to a previous error during capture"."""

from __future__ import annotations

import threading
from typing import Any

import torch

from harness.graphs.base import CaptureError
from harness.graphs.emulator.callsite import at_callsite, current_callsite
from harness.graphs.emulator.cuda_errors import NOT_PERMITTED, cuda_first


def refuses_unsafe_call(graph: Any, own_thread: bool) -> bool:
    """Whether `graph`'s capture (None: none under way) refuses an unsafe call from the thread that
    began it (`own_thread`) or from another."""
    if graph is None:
        return False
    mode = graph.capture_error_mode
    return mode == "global" or (mode == "thread_local" and own_thread)


def is_capture_thread(graph: Any) -> bool:
    return threading.get_ident() == graph.capture_thread


def invalidate_and_raise(graph: Any, error: CaptureError) -> None:
    """The refused call's error: the capture is invalidated, and the call raises it."""
    graph.invalidate(error)
    raise error


class UnsafeCallError(CaptureError, getattr(torch, "AcceleratorError", RuntimeError)):
    """An unsafe call the capture refused: CUDA's runtime error, which torch raises from
    `C10_CUDA_CHECK` as `torch.AcceleratorError`; also a `CaptureError`, for code that catches the
    harness's errors."""


def refuse_host_alloc(graph: Any, nbytes: int) -> None:
    """A new pinned block (cudaHostAlloc) of `nbytes` for the calling thread. PyTorch's caching host
    allocator makes it under a relaxed capture-mode guard, so the capturing thread's own is never
    refused; another thread's is refused while a global capture is under way (both measured on an
    H200, torch 2.11: "operation not permitted when stream is capturing" in that thread, then the
    capture's end failed)."""
    if graph is None or is_capture_thread(graph) or not refuses_unsafe_call(graph, False):
        return
    error = UnsafeCallError(cuda_first(NOT_PERMITTED, at_callsite(
        f"a pinned host allocation of {nbytes} bytes in another thread needs a new block "
        f"(cudaHostAlloc), a potentially unsafe call while a capture_error_mode='global' capture "
        f"is under way. The capture is invalidated; allocate the pinned buffers before the capture "
        f"begins, or capture with capture_error_mode='thread_local'", current_callsite())),
        op="cudaHostAlloc")
    invalidate_and_raise(graph, error)


def refuse_device_malloc(graph: Any, nbytes: int) -> None:
    """A new device segment (cudaMalloc) for another thread's allocation of `nbytes` on a stream
    outside the capture: PyTorch's caching allocator takes the relaxed capture-mode guard only when
    the calling thread's current stream is capturing, so a global capture refuses it, as the
    `capture_error_mode` documentation of `torch.cuda.graph` says ("global" errors on actions in
    other threads)."""
    error = UnsafeCallError(cuda_first(NOT_PERMITTED, at_callsite(
        f"a device allocation of {nbytes} bytes in another thread needs a new segment (cudaMalloc), "
        f"a potentially unsafe call while a capture_error_mode='global' capture is under way. The "
        f"capture is invalidated; allocate that thread's memory before the capture begins, or "
        f"capture with capture_error_mode='thread_local'", current_callsite())), op="cudaMalloc")
    invalidate_and_raise(graph, error)
