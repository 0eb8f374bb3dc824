"""cuBLAS handles on the emulated CUDA device, as PyTorch hands them out on CUDA, and the refusal
of a handle's creation inside a capture.

PyTorch's rule (ATen's CublasHandlePool.cpp over DeviceThreadHandles.h): a thread's first BLAS
call on a device reserves a handle for that (thread, device) and keeps it until the thread ends;
the reservation takes a handle an ended thread gave back to the device's pool when there is one,
and only otherwise creates one with `cublasCreate`. Handles are never destroyed, so the pool holds
as many per device as the most threads that used it at once. cuBLASLt's handle is the cuBLAS one
on CUDA (`getCurrentCUDABlasLtHandle` casts it; ROCm alone keeps a second pool), so an addmm's
fused-bias path needs no handle of its own. The autograd engine runs a device's backward in a
thread of its own, which holds a handle of its own.

`cublasCreate` is a potentially unsafe call under stream capture (it allocates device memory and
synchronizes), so CUDA refuses it as it refuses other such calls (cudaStreamCaptureMode): in
"global" mode from every thread of the process, in "thread_local" mode from the thread that began
the capture only, never in "relaxed" mode. cuBLAS reports the refusal as
CUBLAS_STATUS_NOT_INITIALIZED in the capturing thread, and the capture is invalidated (measured on
an H200 with torch 2.11: a process's first matmul inside `torch.cuda.graph`, then `capture_end()`'s
"operation failed due to a previous error during capture"). From another thread during a global
capture the call fails with the runtime's cudaErrorStreamCaptureUnsupported ("operation not
permitted when stream is capturing", measured on the same H200), and the capture is invalidated
all the same. A handle taken back from an ended thread is no creation and
is not refused; nor is a handle's first use on another stream (its workspace comes from the
capture's pool, blas_workspaces.py).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from harness.graphs.base import CaptureError
from harness.graphs.emulator.callsite import at_callsite, current_callsite
from harness.graphs.emulator.cuda_errors import NOT_PERMITTED, cuda_first
from harness.emulation.unsafe_calls import invalidate_and_raise, refuses_unsafe_call

# TORCH_CUDABLAS_CHECK's text for the status cublasCreate returns under a capture.
CREATE_REFUSED = "CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`"
BACKWARD = "autograd engine"  # the owner of backward's handles: the engine's device thread


class BlasHandles:
    """Which handle each (owner, device) holds; an owner is a thread's id, or BACKWARD.
    `capture()` is the graph being captured (with `capture_error_mode`, `capture_thread` and
    `invalidate(error)`), or None."""

    def __init__(self, capture: Callable[[], Any]) -> None:
        self._capture = capture
        self._held: dict[tuple[object, int], int] = {}  # (owner, device) -> handle
        self._created: dict[int, int] = {}  # device -> handles created there so far
        self._lock = threading.Lock()

    def reserve(self, owner: object, device: int, op: str) -> tuple[int, bool]:
        """The handle `owner` uses on `device` for `op` (the torch call, for the error), and
        whether this reservation took it now (so its workspaces are to be made again)."""
        key = (owner, device)
        handle = self._held.get(key)
        if handle is not None:
            return handle, False
        with self._lock:
            free = self._released(device)
            if free:
                handle = min(free)
                self._held = {k: h for k, h in self._held.items()
                              if not (k[1] == device and h == handle)}
            else:
                _refuse_creation(self._capture(), owner, op)
                handle = self._created.get(device, 0)
                self._created[device] = handle + 1
            self._held[key] = handle
        return handle, True

    def holds(self, owner: object) -> bool:
        """Whether `owner` holds a handle on some device."""
        return any(o == owner for o, _ in self._held)

    def count(self, device: int = 0) -> int:
        """How many handles were created on `device`."""
        return self._created.get(device, 0)

    def _released(self, device: int) -> list[int]:
        """Handles of `device` whose thread has ended: back in the pool (the thread-local pool
        window's destructor gives them back)."""
        alive = {t.ident for t in threading.enumerate()}
        return [h for (owner, d), h in self._held.items()
                if d == device and owner is not BACKWARD and owner not in alive]


def _refuse_creation(graph: Any, owner: object, op: str) -> None:
    own_thread = graph is not None and owner == graph.capture_thread
    if not refuses_unsafe_call(graph, own_thread):
        return
    mode = graph.capture_error_mode
    whose = ("this thread's" if own_thread else
             "the autograd engine's device thread's" if owner is BACKWARD else "another thread's")
    why = (f"{op} is {whose} first BLAS call on the device, so PyTorch creates its cuBLAS handle "
           f"(cublasCreate), a potentially unsafe call while a capture_error_mode={mode!r} "
           f"capture is under way{'' if own_thread else ' in another thread'}")
    remedy = ("run one matmul in this thread before capture_begin() (a warmup pass, as runtimes "
              "do before they capture), or capture with capture_error_mode='relaxed'"
              if own_thread else
              "run one matmul in that thread (a backward pass for the autograd engine) before the "
              "capture begins, or capture with capture_error_mode='thread_local'")
    cuda_text = CREATE_REFUSED if own_thread else NOT_PERMITTED
    error = CaptureError(cuda_first(cuda_text, at_callsite(
        f"{why}. The capture is invalidated; {remedy}", current_callsite())), op=op)
    invalidate_and_raise(graph, error)
