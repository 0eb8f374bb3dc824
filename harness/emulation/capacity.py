"""The emulated device's capacity: a factory asking for more than the device has free raises CUDA's
out-of-memory error before any host memory is touched. Without it a request such as
`torch.zeros(2**40, device="cuda")` becomes a 4 TiB host allocation, which a machine that
overcommits memory grants and then kills the process for, instead of CUDA's catchable error.

Only factories that name their size are checked ahead; any other op's result is counted when it
is made (`DeviceMemory`), as its size is known only once its kernel has run.
"""

from __future__ import annotations

import torch

# torch takes Python's scalar types as dtypes (`torch.zeros(n, dtype=bool)`, transformers' masks).
_PYTHON_TYPES = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}
_SIZED = {torch.empty, torch.zeros, torch.ones, torch.rand, torch.randn, torch.full,
          torch.empty_strided, torch.randint, torch.randperm}


def _shape(func, args: tuple) -> tuple[int, ...] | None:
    if func is torch.randperm:
        return (args[0],) if args and isinstance(args[0], int) else None
    if func is torch.randint:
        sizes = [a for a in args if isinstance(a, (tuple, list, torch.Size))]
        return tuple(sizes[-1]) if sizes else None
    if not args:
        return None
    first = args[0]
    if isinstance(first, (tuple, list, torch.Size)):
        return tuple(first)
    if func in (torch.full, torch.empty_strided):
        return None
    if all(isinstance(a, int) for a in args):
        return tuple(args)
    return None


def requested_bytes(func, args: tuple, kwargs: dict) -> int:
    """Bytes a sized factory asks for (0 when it is not one, or its size is not plain ints)."""
    if func not in _SIZED:
        return 0
    shape = _shape(func, args)
    if shape is None or not all(isinstance(n, int) for n in shape):
        return 0
    numel = 1
    for n in shape:
        numel *= max(n, 0)
    dtype = kwargs.get("dtype")
    if dtype is None:
        dtype = torch.int64 if func in (torch.randint, torch.randperm) else torch.get_default_dtype()
    return numel * _PYTHON_TYPES.get(dtype, dtype).itemsize


def format_size(nbytes: float) -> str:
    """Sizes as CUDA's caching allocator writes them in its messages."""
    if nbytes != nbytes:
        return "an unknown number of bytes"
    if nbytes <= 1024:
        return f"{int(nbytes)} bytes"
    for unit, scale in (("KiB", 2**10), ("MiB", 2**20)):
        if nbytes <= scale * 1024:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes / 2**30:.2f} GiB"


# c10's CUDACachingAllocator refuses a request this large before looking at the device.
ONE_EXA_BYTES = 1 << 60


_FRAGMENTATION_ADVICE = (
    " If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
    "for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html"
    "#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)")


def out_of_memory_error(nbytes: float, index: int, total: int, free: int, why: str = "", *,
                        allocated: int = 0, reserved: int = 0,
                        allowed: int | None = None) -> torch.OutOfMemoryError:
    """CUDA's caching allocator's text (DeviceCachingAllocator::malloc), with the emulated
    device's figures: the process's memory as reserved here (no other process shares the
    device, and no NVML lists processes), the allocator's allocated and cached bytes, and the
    bytes a memory fraction allows (`allowed`)."""
    if nbytes >= ONE_EXA_BYTES:
        return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate more than 1EB memory.")
    note = f" (emulated device: {why})" if why else ""
    allowed_info = f"{format_size(allowed)} allowed; " if allowed is not None else ""
    return torch.OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {format_size(nbytes)}. GPU {index} has a total "
        f"capacity of {format_size(total)} of which {format_size(free)} is free. Including "
        f"non-PyTorch memory, this process has {format_size(reserved)} memory in use. "
        f"{allowed_info}Of the allocated memory {format_size(allocated)} is allocated by "
        f"PyTorch, and {format_size(reserved - allocated)} is reserved by PyTorch but "
        f"unallocated.{_FRAGMENTATION_ADVICE}{note}")
