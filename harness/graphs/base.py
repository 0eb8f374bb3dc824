"""The contract both graph backends obey (docs/design.md, "The graph backend contract")."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable

import torch


class CaptureError(RuntimeError):
    """Something was done during capture that a graph cannot record (a host sync, a data-dependent
    shape, a nested capture, ...). The message names the op and, where possible, the remedy."""

    def __init__(self, message: str, *, op: str | None = None) -> None:
        super().__init__(message)
        self.op = op


class CaptureSyncError(CaptureError, torch.AcceleratorError):
    """A host sync during capture (`.item()`, a blocking copy, a device-wide synchronize). CUDA
    raises these from `C10_CUDA_CHECK` as `torch.AcceleratorError` ("CUDA error: operation not
    permitted when stream is capturing"); it is also a `CaptureError`, for code that catches the
    harness's errors."""


class CaptureDependencyError(CaptureError, torch.AcceleratorError):
    """A capturing stream made to wait on work outside its capture (an event recorded before the
    capture, or on a stream that never joined it). CUDA raises cudaErrorStreamCaptureIsolation from
    `C10_CUDA_CHECK` as `torch.AcceleratorError`, in every capture_error_mode."""


class CaptureInvalidatedError(CaptureError, torch.AcceleratorError):
    """`capture_end()` of a capture that an earlier refused call (a sync, a dependency on outside
    work) invalidated: cudaStreamEndCapture's cudaErrorStreamCaptureInvalidated, raised by
    `C10_CUDA_CHECK` as `torch.AcceleratorError`. Under `torch.cuda.graph` it is what the caller
    sees, with the refused call's error as its `__context__`."""


class FreedMemoryError(CaptureError):
    """`replay()` of a graph whose memory it does not own (a buffer allocated before capture: a
    workspace, a weight, a static input) was freed since capture. CUDA replays into the stale
    address, clobbering whatever the allocator put there; the emulator refuses instead."""


class StorageChangedError(FreedMemoryError):
    """`replay()` of a graph after a tensor it captured was pointed at other memory in place
    (`set_()`, `resize_()` growing it, `.data = ...`): the same Python object, a new address. The
    graph keeps the old address; the message names both addresses and the capture's line."""


def released_graph_error() -> CaptureError:
    """What `replay()` raises once `reset()` released the recording, on every backend."""
    return CaptureError("replay() after reset(): this graph's recording was released", op="replay")


class CapturedGraph(ABC):
    """A recorded piece of work. `output` is what the captured function returned (static outputs,
    overwritten by every replay); `pool` is the pool handle its allocations came from."""

    output: Any
    pool: Any

    @abstractmethod
    def replay(self) -> None:
        """Re-execute the recorded work against the captured storages."""

    @abstractmethod
    def reset(self) -> None:
        """Release the recording; a later `replay()` raises `CaptureError`."""


class GraphBackend(ABC):
    """Captures callables into graphs. `name` is "cuda" or "emulated"; `device` is where the
    tensors the captured work touches must live."""

    name: str
    device: Any

    def capture(self, fn: Callable[[], Any], *, pool: Any = None) -> CapturedGraph:
        """Run `fn()` once in capture mode and return the recording."""
        if self.is_capturing():
            raise CaptureError("capture() inside a capture: graphs cannot be captured while "
                               "another capture is in progress", op="capture")
        return self._capture(fn, pool=pool)

    @abstractmethod
    def _capture(self, fn: Callable[[], Any], *, pool: Any) -> CapturedGraph:
        """`capture` without the checks every backend shares."""

    @abstractmethod
    def graph_pool_handle(self) -> Any:
        """A fresh pool handle; graphs captured with the same handle share one pool."""

    @abstractmethod
    def is_capturing(self) -> bool:
        """True while a capture is in progress on this backend."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for all recorded and eager work to finish."""
