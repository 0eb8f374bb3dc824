"""`torch.cuda.comm` (torch.nn.parallel.comm, nn.DataParallel's path) across the emulated devices.

torch's Python functions stay as they are, argument checks included; what they call in C++, which a
CPU build lacks (`torch._C._broadcast`, `_broadcast_out`, `_broadcast_coalesced`, `_scatter`,
`_scatter_out`, `_gather`, `_gather_out`: torch/csrc/cuda/comm.cpp), is modelled here with the
placement mode's own factories and copies, so each result is device memory on the device CUDA puts
it on, allocated as CUDA allocates it, and a result CUDA hands back as the input itself is the input
itself. `reduce_add` takes NCCL's path, as on a CUDA build with NCCL: `torch.cuda.nccl.is_available`
asks for `_nccl_all_reduce`, and `_nccl_reduce` is modelled (its reads of the other devices are
copies to the root device, which NCCL makes through buffers of its own). NCCL's other calls are
refused by name: they need communicators between processes or devices that run kernels at once.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import torch

from harness import torch_internals
from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice
from harness.emulation.device_memory import is_device_memory

# ScalarType's order (c10/core/ScalarType.h): CUDA's take_tensors keeps its leftover groups in a
# std::map keyed by it, so the last buffers are allocated in this order.
_SCALAR_ORDER = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                 torch.float32, torch.float64, torch.complex32, torch.complex64, torch.complex128,
                 torch.bool, torch.qint8, torch.quint8, torch.qint32, torch.bfloat16)

# ncclRedOp_t's values, which torch.cuda.nccl passes as `op`.
_REDUCTIONS: dict[int, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    0: torch.Tensor.add_, 1: torch.Tensor.mul_,
    2: lambda out, other: torch.maximum(out, other, out=out),
    3: lambda out, other: torch.minimum(out, other, out=out),
}

# torch.cuda.nccl's collectives other than reduce (torch/csrc/cuda/python_nccl.cpp).
REFUSED_NCCL = ("_nccl_all_reduce", "_nccl_broadcast", "_nccl_all_gather", "_nccl_reduce_scatter",
                "_nccl_version", "_nccl_version_suffix", "_nccl_unique_id", "_nccl_init_rank")
# What the NCCL torch was built with: a build fact, answered by a CUDA build with or without a GPU
# (runtimes log it at start-up), so left alone where the build has it.
NCCL_BUILD_FACTS = ("_nccl_version", "_nccl_version_suffix")


def _on(index: int) -> torch.device:
    if index < 0:
        raise RuntimeError(f"Expected non-negative device index, but got {index}")
    return torch.device("cuda", index)


def _nccl_would_run(tensors: Sequence[torch.Tensor]) -> bool:
    """torch::cuda::nccl::is_available: dense contiguous device tensors, one a device. NCCL writes
    the results' memory without autograd; the copy CUDA falls back to records a grad_fn."""
    devices = [t.get_device() for t in tensors]
    return len(set(devices)) == len(devices) and all(
        is_device_memory(t) and t.is_contiguous() and t.layout == torch.strided for t in tensors)


def _broadcast_into(tensor: torch.Tensor, outs: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad() if _nccl_would_run([tensor, *outs]) else contextlib.nullcontext():
        for out in outs:
            out.copy_(tensor, non_blocking=True)
    return outs


def broadcast(tensor: torch.Tensor, devices: Sequence[int]) -> list[torch.Tensor]:
    """`torch._C._broadcast`: on the tensor's own device the tensor itself, elsewhere a copy (of
    a sparse tensor, a sparse tensor with its parts copied, as CUDA's sparse-to-sparse copy)."""
    source = tensor.get_device()
    if tensor.layout != torch.strided:
        return [tensor if d == source else tensor.to(_on(d), non_blocking=True) for d in devices]
    copies = iter(_broadcast_into(tensor, [
        torch.empty(tensor.size(), dtype=tensor.dtype, device=_on(d))
        for d in devices if d != source]))
    return [tensor if d == source else next(copies) for d in devices]


def broadcast_out(tensor: torch.Tensor, out: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`torch._C._broadcast_out`."""
    for i, t in enumerate(out):
        if not is_device_memory(t):
            raise RuntimeError(f"Expected all output tensors to be CUDA tensors, but output tensor "
                               f"at index {i} has device '{t.device}'")
        if t.size() != tensor.size():
            raise RuntimeError(f"Expected all output tensors to have same shape as the source "
                               f"tensor {list(tensor.size())}, but output tensor at index {i} has "
                               f"shape {list(t.size())}")
    return _broadcast_into(tensor, list(out))


def _take_tensors(tensors: Sequence[torch.Tensor], limit: int) -> list[list[int]]:
    """torch::utils::take_tensors (not fine-grained) as positions: a type's group is closed once
    its bytes reach `limit`; the groups left over follow in ScalarType's order."""
    closed: list[list[int]] = []
    open_groups: dict[tuple, tuple[list[int], list[int]]] = {}
    for i, t in enumerate(tensors):
        key = (t.layout != torch.strided, t.dtype)  # a sparse type is a type of its own
        positions, size = open_groups.setdefault(key, ([], [0]))
        positions.append(i)
        size[0] += _nbytes(t)
        if size[0] >= limit:
            closed.append(positions)
            del open_groups[key]
    order = {dtype: n for n, dtype in enumerate(_SCALAR_ORDER)}
    rest = sorted(open_groups.items(),
                  key=lambda item: (item[0][0], order.get(item[0][1], len(order))))
    return closed + [positions for _, (positions, _) in rest]


def _nbytes(t: torch.Tensor) -> int:
    """What take_tensors counts for a tensor: a sparse one's indices and values."""
    if t.layout == torch.sparse_coo:
        return _nbytes(t._indices()) + _nbytes(t._values())
    return t.numel() * t.element_size()


def _unflatten(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """torch::utils::unflatten_dense_tensors, each result re-wrapped with a version counter of its
    own (comm.cpp's NOTE [ Version Counter in comm.*_coalesced ])."""
    out, offset = [], 0
    for t in like:
        if t.numel() == 0:
            out.append(torch.empty(0, dtype=flat.dtype, device=flat.device))
            continue
        out.append(flat.narrow(0, offset, t.numel()).view(t.size()).data)
        offset += t.numel()
    return out


def broadcast_coalesced(tensors: Sequence[torch.Tensor], devices: Sequence[int],
                        buffer_size: int) -> list[list[torch.Tensor]]:
    """`torch._C._broadcast_coalesced`: the tensors themselves for devices[0]; for each other
    device, views of one flat copy per group of `_take_tensors`."""
    if not all(t.get_device() == devices[0] for t in tensors):
        raise RuntimeError(f"All tensors must be on devices[0]: {devices[0]}")
    outputs: list[list[Any]] = [list(tensors)] + [[None] * len(tensors) for _ in devices[1:]]
    for positions in _take_tensors(tensors, buffer_size):
        chunk = [tensors[p] for p in positions]
        if chunk[0].layout != torch.strided:
            # CUDA flattens a sparse group's indices and values apart and rebuilds each tensor
            # from the copies; here each is copied whole: the same values, other blocks
            for p, t in zip(positions, chunk):
                for device_outputs, copy in zip(outputs[1:], broadcast(t, devices)[1:]):
                    device_outputs[p] = copy
            continue
        flat = (chunk[0].contiguous().view(-1) if len(chunk) == 1 else
                torch.cat([t.contiguous().view(-1) for t in chunk]))
        copies = broadcast(flat, devices)
        for device_outputs, copy in zip(outputs[1:], copies[1:]):
            for p, t in zip(positions, _unflatten(copy, chunk)):
                device_outputs[p] = t
    return outputs


def _stream_for(streams: Sequence[Any] | None, i: int, index: int):
    stream = streams[i] if streams is not None and i < len(streams) else None
    if stream is None:
        return contextlib.nullcontext()
    if stream.device_index != index:
        raise RuntimeError(f"Expected the device associated with the stream at index {i} (was "
                           f"{stream.device_index}) to match the device supplied at that index "
                           f"(expected {index})")
    return torch.cuda.stream(stream)


def scatter(tensor: torch.Tensor, devices: Sequence[int], chunk_sizes: Sequence[int] | None,
            dim: int, streams: Sequence[Any] | None) -> list[torch.Tensor]:
    """`torch._C._scatter`: views of the tensor for its own device, copies elsewhere."""
    if not devices:
        raise RuntimeError("Expected at least one device to scatter to")
    if chunk_sizes is not None and len(chunk_sizes) != len(devices):
        raise RuntimeError(f"Expected devices and chunk_sizes to be of same length, but got "
                           f"len(devices) = {len(devices)} and len(chunk_sizes) = "
                           f"{len(chunk_sizes)}")
    chunks = list(tensor.split_with_sizes(list(chunk_sizes), dim) if chunk_sizes is not None
                  else tensor.chunk(len(devices), dim))
    source = tensor.get_device()
    for i, chunk in enumerate(chunks):
        if devices[i] != source:
            with _stream_for(streams, i, devices[i]):
                chunks[i] = chunk.to(_on(devices[i]), non_blocking=True)
    return chunks


def scatter_out(tensor: torch.Tensor, out: Sequence[torch.Tensor], dim: int,
                streams: Sequence[Any] | None) -> list[torch.Tensor]:
    """`torch._C._scatter_out`."""
    if not out:
        raise RuntimeError("Expected at least one output tensor to scatter to")
    dim = _wrap(dim, tensor.dim())
    sizes = []
    for i, t in enumerate(out):
        if not is_device_memory(t):
            raise RuntimeError(f"Expected all output tensors to be CUDA tensors, but output tensor "
                               f"at index {i} has device '{t.device}'")
        same = t.dim() == tensor.dim() and all(
            a == b for d, (a, b) in enumerate(zip(t.size(), tensor.size())) if d != dim)
        if not same:
            raise RuntimeError(f"Output tensor at index {i} has incorrect shape: {list(t.size())}. "
                               f"Expected same shape except for scatter dim {dim} as the source "
                               f"tensor: {list(tensor.size())}")
        sizes.append(t.size(dim))
    if sum(sizes) != tensor.size(dim):
        raise RuntimeError(f"Total size for output tensors along scatter dim {dim} does not match "
                           f"the source tensor size at dim {dim}. Expected {tensor.size(dim)}, but "
                           f"got total size {sum(sizes)}")
    for i, (t, chunk) in enumerate(zip(out, tensor.split_with_sizes(sizes, dim))):
        with _stream_for(streams, i, t.get_device()):
            t.copy_(chunk, non_blocking=True)
    return list(out)


def _wrap(dim: int, ndim: int) -> int:
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise IndexError(f"Dimension out of range (expected to be in range of "
                         f"[{-max(ndim, 1)}, {max(ndim, 1) - 1}], but got {dim})")
    return dim % max(ndim, 1)


def _memory_format(t: torch.Tensor) -> torch.memory_format:
    """at::Tensor::suggest_memory_format, for the layouts torch's Python can ask about."""
    for ndim, fmt in ((4, torch.channels_last), (5, torch.channels_last_3d)):
        if t.dim() == ndim and not t.is_contiguous() and t.is_contiguous(memory_format=fmt):
            return fmt
    return torch.contiguous_format


def _gathered_size(tensors: Sequence[torch.Tensor], dim: int, quoted: bool) -> list[int]:
    if not tensors:
        raise RuntimeError("Expected at least one tensor to gather from")
    expected = list(tensors[0].size())
    total = 0
    for i, t in enumerate(tensors):
        if not is_device_memory(t):
            where = f"'{t.device}'" if quoted else f"{t.device}"
            raise RuntimeError(f"Expected all input tensors to be CUDA tensors, but tensor at "
                               f"index {i} has device {where}")
        if t.dim() != len(expected):
            space = " " if quoted else ""  # comm.cpp's gather has none before "has"
            raise RuntimeError(f"Expected all input tensors to have the same number of "
                               f"dimensions, but tensor at index {i}{space}has {t.dim()} "
                               f"dimensions, (expected {len(expected)})")
        expected[dim] = t.size(dim)
        if list(t.size()) != expected:
            raise RuntimeError(f"Input tensor at index {i} has invalid shape {list(t.size())}, "
                               f"but expected {expected}")
        total += t.size(dim)
    expected[dim] = total
    return expected


def _gather_into(tensors: Sequence[torch.Tensor], out: torch.Tensor, dim: int) -> torch.Tensor:
    parts = out.split_with_sizes([t.size(dim) for t in tensors], dim)
    for part, t in zip(parts, tensors):
        part.copy_(t, non_blocking=is_device_memory(out))
    return out


def gather(tensors: Sequence[torch.Tensor], dim: int, destination: int | None) -> torch.Tensor:
    """`torch._C._gather`: a new tensor on `destination` (-1: the host; None: the current
    device)."""
    dim = _wrap(dim, tensors[0].dim()) if tensors else dim
    size = _gathered_size(tensors, dim, quoted=False)
    formats = {_memory_format(t) for t in tensors}
    fmt = formats.pop() if len(formats) == 1 else torch.contiguous_format
    device = ("cpu" if destination == -1 else
              "cuda" if destination is None else torch.device("cuda", destination))
    out = torch.empty(size, dtype=tensors[0].dtype, device=device, memory_format=fmt)
    return _gather_into(tensors, out, dim)


def gather_out(tensors: Sequence[torch.Tensor], out: torch.Tensor, dim: int) -> torch.Tensor:
    """`torch._C._gather_out`."""
    dim = _wrap(dim, tensors[0].dim()) if tensors else dim
    size = _gathered_size(tensors, dim, quoted=True)
    if list(out.size()) != size:
        raise RuntimeError(f"Expected out tensor to have shape {size}, but got {list(out.size())}")
    return _gather_into(tensors, out, dim)


def nccl_reduce(inputs: Sequence[torch.Tensor], output: torch.Tensor, root: int, op: int,
                streams: Sequence[Any] | None, comms: Any) -> None:
    """`torch._C._nccl_reduce`: `output` (on inputs[root]'s device) gets the reduction of the
    inputs, without autograd, as NCCL writes it."""
    if comms is not None:
        raise UnsupportedOnEmulatedDevice(
            "torch.cuda.nccl.reduce(..., comms=...) is not supported by harness.emulate_cuda(): "
            "NCCL communicators are the CUDA runtime's objects, which the emulated devices have "
            "none of; call it without comms")
    combine = _REDUCTIONS.get(op)
    if combine is None:
        raise UnsupportedOnEmulatedDevice(
            f"torch.cuda.nccl.reduce(op={op!r}) is not supported by harness.emulate_cuda(): "
            f"the emulated NCCL reduce knows ncclSum, ncclProd, ncclMax and ncclMin (0 to 3)")
    if not _nccl_would_run(list(inputs)) or any(
            t.dtype != output.dtype or t.numel() != output.numel() for t in inputs):
        raise RuntimeError("torch.cuda.nccl.reduce: the inputs must be dense contiguous CUDA "
                           "tensors, one a device, of the output's dtype and number of elements")
    with torch.no_grad(), _stream_for(streams, root, inputs[root].get_device()):
        if output is not inputs[root]:
            output.copy_(inputs[root])
        for i, t in enumerate(inputs):
            if i != root:
                combine(output, t.to(output.device, non_blocking=True))


def _refused(name: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise UnsupportedOnEmulatedDevice(
            f"torch._C.{name} (torch.cuda.nccl) is not supported by harness.emulate_cuda(): "
            f"NCCL's collectives other than reduce run kernels on several devices at once, "
            f"through communicators the emulated devices do not have. torch.cuda.comm's "
            f"broadcast, scatter, gather and reduce_add work without them")

    refuse.__name__ = name
    return refuse


def patches(state) -> list[tuple[Any, str, Any]]:
    owner = torch_internals.torch_namespace("torch._C")
    comm = {"_broadcast": broadcast, "_broadcast_out": broadcast_out,
            "_broadcast_coalesced": broadcast_coalesced, "_scatter": scatter,
            "_scatter_out": scatter_out, "_gather": gather, "_gather_out": gather_out,
            "_nccl_reduce": nccl_reduce}
    return ([(owner, name, fn) for name, fn in comm.items()]
            + [(owner, name, _refused(name)) for name in REFUSED_NCCL
               if not (name in NCCL_BUILD_FACTS and hasattr(owner, name))])


__all__ = ["REFUSED_NCCL", "patches"]
