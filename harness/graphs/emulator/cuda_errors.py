"""CUDA's own words for what a capture refuses, and the exception types CUDA raises them with.

Code written against CUDA matches these texts (PyTorch's own tests do, with `assertRaisesRegex`),
so every refusal the emulator shares with CUDA begins with CUDA's message, word for word, and only
then adds the harness's detail: the op, the user's line, the remedy. The texts come from PyTorch's
C++ sources: aten/src/ATen/native/cuda/Copy.cu (pageable copies), c10/cuda/CUDAException.cpp
(`C10_CUDA_CHECK`: "CUDA error: " and the runtime's string for the error code),
aten/src/ATen/cuda/CUDAGeneratorImpl.cpp (reseeding), aten/src/ATen/cuda/CUDAGraph.cpp and
c10/cuda/CUDACachingAllocator.cpp (a released pool).
"""

from __future__ import annotations

from harness.graphs.base import CaptureError, CaptureSyncError

# Copy.cu, copy_kernel_cuda: a copy between the host and the device whose host side is not pinned,
# in either direction, while the current stream captures (a RuntimeError).
PAGEABLE_COPY = ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU "
                 "tensor is pinned. Please use tensor.pin_memory() or allocate the tensor with "
                 "pin_memory=True.")
# cudaErrorStreamCaptureUnsupported (900): a host sync (cudaStreamSynchronize in `.item()`, a
# blocking copy, `torch.cuda.synchronize()`, ...) while a stream captures.
NOT_PERMITTED = "CUDA error: operation not permitted when stream is capturing"
# cudaErrorStreamCaptureInvalidated (901): what capture_end() gets once a call invalidated it.
INVALIDATED = "CUDA error: operation failed due to a previous error during capture"
# cudaErrorStreamCaptureUnjoined (904): a forked stream's work not joined back when capture ends.
# The runtime's text (H100, CUDA 13, 2026-12-06); its documentation describes it as "the capture
# sequence contains a fork that was not joined to the primary stream".
UNJOINED = "CUDA error: capturing stream has unjoined work"
# TORCH_CUSOLVER_CHECK (ATen/cuda/Exceptions.h) on cuSOLVER's eigensolvers inside a capture: their
# status and call as measured on an H100 (torch 2.11, CUDA 13, 2026-12-07); the capture is
# invalidated behind them. The call's arguments and the remedy PyTorch appends are not repeated.
CUSOLVER_SYEVD_FAILED = ("cusolver error: CUSOLVER_STATUS_INTERNAL_ERROR, when calling "
                         "`cusolverDnXsyevd(...)`")
CUSOLVER_GEEV_FAILED = ("cusolver error: CUSOLVER_STATUS_INTERNAL_ERROR, when calling "
                        "`cusolverDnXgeev_bufferSize(...)`")
# CUDAGeneratorImpl::set_current_seed during capture, to another seed (a RuntimeError).
RESEED = ("CUDAGeneratorImpl::set_current_seed can be called during stream capture only if new "
          "seed is the same as the original seed.")


def not_capturing(attempt: str) -> str:
    """at::cuda::assertNotCapturing's text (CUDAGraphsUtils.cuh), e.g. for CUDAGeneratorImpl::seed
    and ::clone_impl, which a capture refuses whatever the seed."""
    return (f"{attempt} during CUDA graph capture. If you need this call to be captured, please "
            f"file an issue. Current cudaStreamCaptureStatus: cudaStreamCaptureStatusActive")
# c10/cuda/CUDACachingAllocator.cpp, the pool lookup of beginAllocateToPool: a capture into a pool
# id whose graphs are all gone before a release of cached memory erased it (a RuntimeError; on CUDA
# the build's file path and line follow "at").
RELEASED_POOL = ("it->second->use_count > 0 INTERNAL ASSERT FAILED at "
                 "\"c10/cuda/CUDACachingAllocator.cpp\", please report a bug to PyTorch. ")


def cuda_first(cuda_text: str, detail: str) -> str:
    """CUDA's message, then the harness's detail on its own line."""
    return f"{cuda_text}\n{detail}"


def sync_refused(detail: str, *, op: str | None) -> CaptureSyncError:
    return CaptureSyncError(cuda_first(NOT_PERMITTED, detail), op=op)


def pageable_copy_refused(detail: str, *, op: str | None) -> CaptureError:
    return CaptureError(cuda_first(PAGEABLE_COPY, detail), op=op)


def capture_refused(cuda_text: str, detail: str, *, op: str | None) -> CaptureError:
    """The error of a call CUDA refuses in a capture with `cuda_text`: a refused sync's own type
    (CaptureSyncError), any other text a CaptureError."""
    if cuda_text == NOT_PERMITTED:
        return sync_refused(detail, op=op)
    return CaptureError(cuda_first(cuda_text, detail), op=op)
