"""`torch.cuda.cudart()` on the emulated device: the CUDA runtime calls torch binds, answered for
the emulated device. `torch.cuda.profiler.start()`/`stop()` and `profile()` (what vLLM's and
SGLang's profiling switches call around a run for Nsight) succeed with nothing to record;
`cudaMemGetInfo` answers as `torch.cuda.mem_get_info`; registering pageable host memory as pinned
(`cudaHostRegister`) answers cudaErrorNotSupported, which `torch.cuda.check_error` raises with the
remedy: pinned memory on the emulated device is made by `pin_memory()`, and an address alone does
not say which tensor to mark.
"""

from __future__ import annotations

import enum
from typing import Any, Callable


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
