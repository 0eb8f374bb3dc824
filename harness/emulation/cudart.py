"""`torch.cuda.cudart()` on the emulated device: the CUDA runtime calls torch binds, answered for
the emulated device. `torch.cuda.profiler.start()`/`stop()` and `profile()` (what vLLM's and
SGLang's profiling switches call around a run for Nsight) succeed with nothing to record;
`cudaMemGetInfo` answers as `torch.cuda.mem_get_info`; registering pageable host memory as pinned
(`cudaHostRegister`) answers cudaErrorNotSupported, which `torch.cuda.check_error` raises with the
remedy: pinned memory on the emulated device is made by `pin_memory()`, and an address alone does
not say which tensor to mark. `cudaStreamCreate` writes a new stream handle where it is told, as
CUDA does, for `torch.cuda.ExternalStream` to wrap (PyTorch's test_cuda_multigpu.py makes its
external streams so); `cudaStreamDestroy` forgets it.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
from typing import Any, Callable

# Handles of streams made through cudaStreamCreate: apart from the pooled streams' (0x7E0000 on)
# and never 0 (the default stream)
_CREATED_STREAM_BASE = 0x7F000000


class CudaError(enum.IntEnum):
    """cudaError_t (CUDA's numbering): the codes the emulated runtime returns are named; any
    other code converts too, as torch's `cudaError(code)` does for every code CUDA has (code
    hands `torch.cuda.check_error` codes it got elsewhere, PyTorch's test_check_error a 2)."""

    success = 0
    ErrorInvalidValue = 1
    ErrorMemoryAllocation = 2
    ErrorInitializationError = 3
    ErrorNoDevice = 100
    ErrorInvalidDevice = 101
    ErrorInvalidResourceHandle = 400
    ErrorIllegalAddress = 700
    ErrorNotSupported = 801

    @classmethod
    def _missing_(cls, value):
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        member = int.__new__(cls, value)
        member._name_ = f"cudaError{value}"
        member._value_ = value
        return member


_MESSAGES = {
    CudaError.success: "no error",
    CudaError.ErrorInvalidValue: "invalid argument",
    CudaError.ErrorMemoryAllocation: "out of memory",
    CudaError.ErrorInitializationError: "initialization error",
    CudaError.ErrorNoDevice: "no CUDA-capable device is detected",
    CudaError.ErrorInvalidDevice: "invalid device ordinal",
    CudaError.ErrorInvalidResourceHandle: "invalid resource handle",
    CudaError.ErrorIllegalAddress: "an illegal memory access was encountered",
    CudaError.ErrorNotSupported: (
        "operation not supported: cudaHostRegister/cudaHostUnregister on the emulated CUDA device "
        "(it cannot tell which tensor an address belongs to); make pinned host memory with "
        "tensor.pin_memory() or torch.empty(..., pin_memory=True)"),
}


class EmulatedCudart:
    """The names of torch's `torch._C._cudart` that code calls, for the emulated device."""

    cudaError = CudaError  # noqa: N815 (torch's names)

    def __init__(self, mem_get_info: Callable[[Any], tuple[int, int]]) -> None:
        self._mem_get_info = mem_get_info
        self.profiler_runs = 0  # cudaProfilerStart calls, for a test to see the switch reached
        self._next_stream = itertools.count(_CREATED_STREAM_BASE)
        self._streams: set[int] = set()

    def cudaGetErrorString(self, code: Any) -> str:  # noqa: N802
        message = _MESSAGES.get(CudaError(int(code)))
        if message is None:
            return f"unrecognized error code {int(code)} (the emulated runtime knows the texts " \
                   f"of {', '.join(str(int(c)) for c in _MESSAGES)})"
        return message

    def cudaProfilerStart(self) -> CudaError:  # noqa: N802
        self.profiler_runs += 1
        return CudaError.success

    def cudaProfilerStop(self) -> CudaError:  # noqa: N802
        return CudaError.success

    def cudaMemGetInfo(self, device: int) -> tuple[int, int]:  # noqa: N802
        return self._mem_get_info(device)

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> CudaError:  # noqa: N802
        return CudaError.ErrorNotSupported

    def cudaHostUnregister(self, ptr: int) -> CudaError:  # noqa: N802
        return CudaError.ErrorNotSupported

    def cudaStreamCreate(self, ptr: int) -> CudaError:  # noqa: N802
        """torch binds cudaStreamCreate(cudaStream_t*) with the pointer as an int."""
        if not ptr:
            return CudaError.ErrorInvalidValue
        handle = next(self._next_stream)
        self._streams.add(handle)
        ctypes.c_void_p.from_address(int(ptr)).value = handle
        return CudaError.success

    def cudaStreamDestroy(self, stream: int) -> CudaError:  # noqa: N802
        if int(stream) not in self._streams:
            return CudaError.ErrorInvalidResourceHandle
        self._streams.discard(int(stream))
        return CudaError.success
