"""cuBLAS workspaces on the emulated CUDA device, as PyTorch keeps them on CUDA.

PyTorch hands cuBLAS a workspace of its own (ATen's CublasHandlePool.cpp, `getCurrentCUDABlasHandle`):
one per (cuBLAS handle, CUDA stream), taken from the caching allocator on that stream at the first
BLAS call there, and kept for the process's life (until `torch._C._cuda_clearCublasWorkspaces()`).
So after the first matmul the regular pool holds a segment that nothing the program made owns, and
a matmul first issued on a stream inside a capture puts its workspace in the graph's private pool
(why inductor's cudagraph trees clear the workspaces around a recording). The size is
CUBLAS_WORKSPACE_CONFIG's (`:SIZE_KIB:COUNT` pairs, summed), read when a workspace is made, as
PyTorch reads it; without it 32 MiB on compute capability 9.x (Hopper), else 4096 KiB x 2 + 16 KiB
x 8.

Handles are per thread and device (blas_handles.py: a thread's handles go back to the pool when it
ends, and a later thread takes them; creating one inside a capture is refused as CUDA refuses it);
the autograd engine runs a device's backward in a thread of its own, so backward's matmuls use
another handle, and with it another workspace per stream. Streams are CUDA's: the
`n`-th stream made at a priority is slot `n % 32` of that priority's pool (c10's CUDAStream.cpp,
32 streams per pool, at most 4 priority pools), so two emulated streams of one slot share a
workspace as the two `torch.cuda.Stream` objects share one cudaStream_t.

A torch.compile'd graph with a matmul-family node counts as one BLAS call each time it runs on
the device (`uses_blas`): inductor's kernels run without any torch call the device sees.

Not modelled: cuBLASLt's own workspace (1 MiB by CUBLASLT_WORKSPACE_SIZE, taken by addmm's fused
bias path and scaled matmuls, which also take the cuBLAS one); inductor's Triton matmul templates
(max-autotune), which call no cuBLAS on CUDA and are counted as if they did.
"""

from __future__ import annotations

import os
import re
import threading
import warnings
from typing import Any, Callable

import torch

from harness.emulation.blas_handles import BACKWARD, BlasHandles

STREAMS_PER_POOL = 32  # c10 CUDAStream.cpp's kStreamsPerPool
PRIORITY_POOLS = 4  # c10's max_compile_time_stream_priorities
HOPPER_BYTES = 4096 * 8 * 1024
OTHER_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
_CONFIG = re.compile(r":([0-9]+):([0-9]+)")

# The torch calls that reach cuBLAS through a handle on CUDA (the placement mode's view: one call
# per torch function); matmul and linear decompose into these in C++.
MATMUL_FUNCS = frozenset({
    torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__,
    torch.mm, torch.Tensor.mm, torch.bmm, torch.Tensor.bmm, torch.addmm, torch.Tensor.addmm,
    torch.Tensor.addmm_, torch.baddbmm, torch.Tensor.baddbmm, torch.Tensor.baddbmm_, torch.addbmm,
    torch.Tensor.addbmm, torch.Tensor.addbmm_, torch.mv, torch.Tensor.mv, torch.addmv,
    torch.Tensor.addmv, torch.Tensor.addmv_, torch.dot, torch.Tensor.dot, torch.vdot,
    torch.Tensor.vdot, torch.inner, torch.Tensor.inner, torch.einsum, torch.tensordot,
    torch.chain_matmul, torch.linalg.matmul, torch.linalg.multi_dot, torch.nn.functional.linear,
    torch.nn.functional.bilinear,
})
# The same family as aten ops: what the autograd engine runs in C++ (backward.py's view).
ATEN_MATMUL_NAMES = frozenset({
    "mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "_addmm_activation",
})


def uses_blas(graph_module: torch.fx.GraphModule) -> bool:
    """Whether a compiled graph calls cuBLAS on CUDA: inductor lowers the matmul family to
    `extern_kernels.mm` and friends, cuBLAS calls on the current stream (so a compiled warmup
    creates the thread's handle as an eager one does)."""
    import operator

    for node in graph_module.graph.nodes:
        target = node.target
        if node.op == "call_function" and (
                target in MATMUL_FUNCS or target is operator.matmul
                or getattr(getattr(target, "overloadpacket", None), "__name__", None)
                in ATEN_MATMUL_NAMES):
            return True
        if node.op == "call_method" and target in _MATMUL_METHODS:
            return True
    return False


_MATMUL_METHODS = frozenset({"matmul", "mm", "bmm", "addmm", "baddbmm", "mv", "dot", "__matmul__"})


def workspace_bytes(major: int, config: str | None) -> int:
    """The workspace size PyTorch's `parseChosenWorkspaceSize` gives a device of compute capability
    `major` under CUBLAS_WORKSPACE_CONFIG `config` (None: unset)."""
    default = HOPPER_BYTES if major == 9 else OTHER_BYTES
    if config is None:
        return default
    pairs = _CONFIG.findall(config)
    if not pairs:
        warnings.warn(f"Could not parse CUBLAS_WORKSPACE_CONFIG, using default workspace size of "
                      f"{default} bytes.", stacklevel=3)
        return default
    return sum(int(size) * 1024 * int(count) for size, count in pairs)


def cuda_stream_slot(stream: Any) -> tuple:
    """Which of CUDA's streams an emulated stream stands for: the default stream, an external
    stream's handle, or a pool stream's (priority pool, index)."""
    if stream.stream_id == 0:
        return ("default", stream.device_index)
    slot = getattr(stream, "pool_slot", None)
    if slot is None:
        return ("external", stream.device_index, stream.cuda_stream)
    return (stream.device_index, *slot)


class BlasWorkspaces:
    """The workspaces made so far, by (handle, stream slot); each one held in the device memory
    (device_memory.py) as a block no storage owns."""

    def __init__(self, memory, major: int, capture: Callable[[], Any]) -> None:
        """`capture()`: the graph being captured, or None (blas_handles.py refuses a handle's
        creation by its capture_error_mode)."""
        self._memory = memory
        self._major = major
        self._held: dict[tuple, object] = {}
        # (owner, stream) -> its handle, for the pairs already served: the hot path
        self._seen: dict[tuple, int] = {}
        self.handles = BlasHandles(capture)
        self._local = threading.local()

    def note_call(self, stream: Any, op: str = "a matmul") -> int:
        """A BLAS call (`op`, the torch call) on `stream` from the calling thread (the autograd
        engine's inside `backward_running()`): the thread's handle is reserved and its workspace
        made if this (handle, stream) has none. Returns the handle (its index on the device)."""
        owner = BACKWARD if getattr(self._local, "backward", False) else threading.get_ident()
        handle = self._seen.get((owner, stream))
        if handle is not None:
            return handle
        handle, taken = self.handles.reserve(owner, stream.device_index, op)
        if taken:
            # A handle taken back from an ended thread: that thread's fast-path entries go.
            self._seen = {k: h for k, h in self._seen.items() if self.handles.holds(k[0])}
        key = (handle, cuda_stream_slot(stream))
        if key not in self._held:
            nbytes = workspace_bytes(self._major, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
            self._held[key] = self._memory.hold_block(nbytes, stream)
        self._seen[(owner, stream)] = handle
        return handle

    def note_backward_call(self, stream: Any, op: str = "a matmul of backward") -> None:
        """A BLAS op the autograd engine ran (its device thread's handle on CUDA)."""
        with self.backward_running():
            self.note_call(stream, op)

    def backward_running(self):
        """A context in which this thread's BLAS calls are the autograd engine's (a recomputed
        forward during backward runs in the engine's thread on CUDA)."""
        return _Backward(self._local)

    def clear(self) -> None:
        """`torch._C._cuda_clearCublasWorkspaces()`: every workspace goes back to the allocator."""
        held, self._held, self._seen = self._held, {}, {}
        for block in held.values():
            self._memory.release_block(block)

    def count(self) -> int:
        return len(self._held)


class _Backward:
    def __init__(self, local: threading.local) -> None:
        self._local = local

    def __enter__(self) -> None:
        self._previous = getattr(self._local, "backward", False)
        self._local.backward = True

    def __exit__(self, *exc) -> None:
        self._local.backward = self._previous
