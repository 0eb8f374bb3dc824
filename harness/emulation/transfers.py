"""Copies between the emulated device's memory and the host, and host reads of device tensors.

On the cpu both memories are the same RAM, so `x.to("cpu")` of a device tensor would hand back the
tensor itself; here every crossing really copies into a new storage, as on CUDA, and the copy is
marked as the memory it lands in. Host reads (`.item()`, `.tolist()`, `bool()`, `.cpu()`) of device
tensors are synchronizations: the device's observers hear of them (`DeviceState.notify_sync`), and
during a capture CUDA refuses them. `.numpy()` of a device tensor raises CUDA's TypeError.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

import threading

from harness.emulation import device_indices
from harness.emulation.backward import engine_marking_paused, gradient_back_to_its_device
from harness.emulation.capture_syncs import read_outside_capture, refuse_host_sync
from harness.emulation.device_memory import DEVICE, PINNED, is_device_memory, memory_mark
from harness.emulation.rules import (
    CPU, blocking_copy_refused, cuda_index, host_copy_refused, names_cuda,
    numpy_of_device_error, pageable_copy_refused)
from harness.graphs.emulator import cuda_errors
from harness.graphs.emulator.host_tensors import HOST_COPY_REFUSED

Tensor = torch.Tensor


def refuse_host_data(state, func, args: tuple) -> None:
    from harness.graphs.emulator.callsite import at_callsite, current_callsite

    if args and isinstance(args[0], Tensor) and memory_mark(args[0]) in (DEVICE, PINNED):
        return  # device data, or a pinned buffer: no pageable copy
    state.refuse(cuda_errors.pageable_copy_refused(at_callsite(
        f"torch.{func.__name__}(..., device='cuda') builds a device tensor from host data during "
        f"capture, {HOST_COPY_REFUSED}", current_callsite()), op="aten.lift_fresh.default"))


# Indexing calls whose index tensors CUDA moves to the indexed tensor's device first (ATen's
# make_info in TensorAdvancedIndexing.cpp: `indice.to(self.device())`; a Python list index becomes
# a tensor on that device from host data): during capture a pageable host-to-device copy.
INDEXING = frozenset({torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.index_put_,
                      torch.Tensor.index_put, torch.index_put})


def refuse_host_indices(state, func, args: tuple) -> None:
    """During capture, refuse an index of device tensor `args[0]` that lives on the host: a host
    tensor of one or more dimensions (a 0-dim integer one is read on the host, as an int) or a
    list of ints (built on the device from host data). `__setitem__`'s value (args[2]) is no index:
    its copy is copy_'s rule."""
    from harness.graphs.emulator.callsite import at_callsite, current_callsite

    indices = args[1] if len(args) > 1 else ()
    found = _host_index(indices)
    if found is None:
        return
    name = getattr(func, "__name__", str(func))
    state.refuse(cuda_errors.pageable_copy_refused(at_callsite(
        f"Tensor.{name} with {found} as an index copies it to the device during capture, "
        f"{HOST_COPY_REFUSED} (make the index a device tensor before capture)", current_callsite()),
        op="aten.index.Tensor"))


def _host_index(index: Any) -> str | None:
    """What in `index` (an index expression) lives on the host, or None."""
    if isinstance(index, Tensor):
        if index.dim() and memory_mark(index) not in (DEVICE, PINNED):
            return f"a host tensor of shape {tuple(index.shape)}"
        return None
    if type(index) is list:
        if any(isinstance(i, (list, Tensor)) for i in index):
            return next((found for i in index if (found := _host_index(i))), None)
        if index and all(isinstance(i, (int, bool)) for i in index):
            return f"the list {index[:4]}{'...' if len(index) > 4 else ''}"
        return None
    if type(index) is tuple:
        return next((found for i in index if (found := _host_index(i))), None)
    return None


def _parse_to(args: tuple, kwargs: dict) -> tuple[Any, dict, Tensor | None]:
    """(the device named or None, the keyword arguments for a device-free `to`, the tensor given
    as `other`) of `Tensor.to(*args, **kwargs)`, args without self."""
    rest = dict(kwargs)
    copy = rest.pop("copy", False)
    positional = list(args)
    other = next((a for a in positional if isinstance(a, Tensor)), None)
    device = rest.pop("device", None)
    if positional and (positional[0] is None or isinstance(positional[0], (str, torch.device)) or
                       (isinstance(positional[0], int) and not isinstance(positional[0], bool))):
        device = positional.pop(0)
    if other is not None:
        positional.remove(other)
        rest.setdefault("dtype", other.dtype)
    # What remains positionally: dtype, non_blocking, copy (the device and other forms alike).
    for name, value in zip(("dtype", "non_blocking", "copy"), positional):
        if name == "copy":
            copy = value
        else:
            rest[name] = value
    if rest.get("dtype") is None:
        rest.pop("dtype", None)
    rest["copy"] = copy
    return device, rest, other


def handlers(mode) -> dict[Callable, Callable]:
    state, memory = mode.state, mode.memory

    def is_device(t: Tensor) -> bool:
        return is_device_memory(t)

    def tracking_started() -> bool:
        """Whether stream tracking hears the device's work (a barrier is a no-op for it before, and
        would start it)."""
        tracking = state.streams_tracking
        return tracking is not None and tracking.work.active

    @contextlib.contextmanager
    def between_devices(runs_on: int, other: int) -> Iterator[None]:
        """ATen's two-way barrier around a copy between devices (Copy.cu, copy_device_to_device):
        the stream the copy runs on (`runs_on`'s current) waits for `other`'s current stream
        before it, and `other`'s waits for it after. Nothing for a copy within one device, nor
        before stream tracking hears the device's work."""
        barrier = runs_on != other and tracking_started()
        if barrier:
            state.streams.current(runs_on).wait_stream(state.streams.current(other))
        yield
        if barrier:
            state.streams.current(other).wait_stream(state.streams.current(runs_on))

    def to_device(t: Tensor, op: str, call: Callable[[], Tensor], non_blocking: bool,
                  index: int = 0) -> Tensor:
        """A host tensor copied to device `index`: from pinned memory with non_blocking it is
        captured; pageable memory, or a blocking copy (it waits for the stream), is refused. The
        copy's memory is that device's allocation (made on its current stream)."""
        if state.capturing():
            if memory_mark(t) not in (PINNED, DEVICE):  # DEVICE: between devices
                state.refuse(pageable_copy_refused(op, tuple(t.shape)))
            elif memory_mark(t) == PINNED and not non_blocking:
                state.refuse(blocking_copy_refused(op, tuple(t.shape), "from"))
        if not non_blocking and memory_mark(t) != DEVICE:
            state.flag_host_sync()  # a blocking copy waits for the stream
        # The copy runs with device `index` current: its memory is allocated there, and the
        # stream tracking hears it on that device's current stream. Between two devices ATen
        # copies on the source's current stream behind a two-way barrier with the destination's
        # (Copy.cu, copy_device_to_device); on the destination's stream the same order is: it
        # waits for the source's stream before the copy, and the source's waits for it after.
        source = device_indices.index_of(t) if memory_mark(t) == DEVICE else index
        with between_devices(index, source):
            previous, memory.call_on_device = memory.call_on_device, True
            try:
                with state.device_guard(index):
                    if state.kernel_log is None:
                        out = call()
                    else:  # a profiler records CUDA activity: the copy is CUDA's memcpy
                        out = state.kernel_log.copy("HtoD", memory_mark(t) == PINNED, call)
            finally:
                memory.call_on_device = previous
            memory.mark_device(out, state.streams.current(index))
        if state.observers:
            state.notify_op(op, (t,), {}, out)
        return out

    def copy_checks_capture() -> bool:
        """Whether Copy.cu's pageable-copy check refuses: it asks the calling thread's current
        stream, so only a copy on a capturing stream (or a lint of what a capture refuses)."""
        if state.capture is None:
            return state.capturing()
        return state.stream_captures(state.current_stream())

    def refuse_unrecorded_sync(op: str) -> None:
        """A device-to-host copy the capture does not record (another thread's, or one on a
        stream outside the capture) still waits for its stream (memcpy_and_sync): refused as
        capture_syncs.py says for a sync of that stream from this thread."""
        graph = state.capture
        if graph is None:
            return
        stream = state.current_stream()
        if state.stream_captures(stream) and threading.get_ident() == graph.capture_thread:
            return  # the capture's own recorder refuses it, in CUDA's words
        if state.stream_captures(stream):
            # another thread's read on a capturing stream waits for the capture: refused
            refuse_host_sync(state, op, stream=stream)
        read_outside_capture(state, op)

    def to_host(t: Tensor, op: str, call: Callable[[], Tensor]) -> Tensor:
        """A device tensor copied into fresh pageable host memory."""
        if copy_checks_capture():
            state.refuse(host_copy_refused(op, tuple(t.shape)))
        refuse_unrecorded_sync(op)
        state.notify_sync(op, t)
        with host_result():
            if state.kernel_log is not None:  # a profiler records CUDA activity
                return state.kernel_log.copy("DtoH", False, call)
            return call()

    @contextlib.contextmanager
    def host_result() -> Iterator[None]:
        """A copy to the host makes host memory, also inside a device call's own run (the code
        a `backward()` runs: a Python backward's `.cpu()`, a compiled graph's transfer back to a
        host input), where the engine's marking and the device-call flag (which a user's
        dispatch mode and the stream tracking read) would follow its device input."""
        previous, memory.call_on_device = memory.call_on_device, False
        try:
            with engine_marking_paused():
                yield
        finally:
            memory.call_on_device = previous

    def to_pinned_host(t: Tensor, rest: dict) -> Tensor:
        """`x.to("cpu", non_blocking=True)` of a device tensor: ATen's `_to_copy` pins the result
        (TensorConversions.cpp, `pin_out`) and the copy is a stream op the host does not wait for,
        so reading the result before a sync reads whatever the copy has not written yet."""
        with host_result():
            out = torch.empty_like(t, device=CPU, dtype=rest.get("dtype", t.dtype),
                                   memory_format=rest.get("memory_format", torch.preserve_format))
        memory.mark_pinned(out)
        copy_(Tensor.copy_, (out, t, True), {})
        return out

    def target_index(device, other, t) -> int:
        """The device index a copy to the device goes to (with several emulated devices)."""
        if state.properties.count == 1:
            return 0
        if other is not None:
            return device_indices.index_of(other) if is_device(other) else 0
        if device is None or not names_cuda(device):
            return device_indices.index_of(t) if is_device(t) else 0
        return cuda_index(device, state.current_index, state.properties.count)

    def to(func, args, kwargs):
        t = args[0]
        device, rest, other = _parse_to(args[1:], kwargs)
        src = is_device(t)
        if other is not None:
            dst = is_device(other)
        elif device is None:
            dst = src
        else:
            dst = names_cuda(device)
            if dst:
                cuda_index(device, state.current_index, state.properties.count)
        index = target_index(device, other, t)
        if dst == src and not (src and index != device_indices.index_of(t)):
            if not src:
                return func(t, **rest)
            # a new tensor (a dtype change, copy=True) is made on t's device, with it current,
            # through the stream tracking's call patterns as the placement mode's device calls
            runner = state.call_runner
            if index == state.current_index:  # the guard would change nothing
                out = func(t, **rest) if runner is None else runner(func, (t,), rest)
            else:
                with state.device_guard(index):
                    out = func(t, **rest) if runner is None else runner(func, (t,), rest)
            memory.mark_device(out, state.streams.current(index))
            device_indices.set_index(out, index)
            return out
        copied = {**rest, "copy": True}
        if src and not dst and rest.get("non_blocking") and t.layout == torch.strided:
            return to_pinned_host(t, rest)
        if dst:
            out = to_device(t, "Tensor.to", lambda: func(t, CPU, **copied),
                            bool(rest.get("non_blocking")), index)
            device_indices.set_index(out, index)
            gradient_back_to_its_device(out, device_indices.index_of(t) if src else None)
            return out
        return to_host(t, "Tensor.to", lambda: func(t, CPU, **copied))

    def cuda(func, args, kwargs):
        t = args[0]
        device = args[1] if len(args) > 1 else kwargs.get("device")
        if device is not None:
            cuda_index(device, state.current_index, state.properties.count)
        rest = {k: v for k, v in kwargs.items() if k != "device"}
        index = target_index("cuda" if device is None else device, None, t)
        if is_device(t) and index == device_indices.index_of(t):
            return t
        out = to_device(t, "Tensor.cuda", lambda: t.to(CPU, copy=True, **rest),
                        bool(args[2] if len(args) > 2 else rest.get("non_blocking")), index)
        device_indices.set_index(out, index)
        gradient_back_to_its_device(out, device_indices.index_of(t) if is_device(t) else None)
        return out

    def cpu(func, args, kwargs):
        t = args[0]
        if not is_device(t):
            return func(*args, **kwargs)
        return to_host(t, "Tensor.cpu", lambda: t.to(CPU, copy=True, **kwargs))

    def numpy(func, args, kwargs):
        if is_device(args[0]):
            raise numpy_of_device_error(state.current_index)
        if state.observers and memory_mark(args[0]) == PINNED:
            state.notify_host_read(getattr(func, "__name__", str(func)), args[0])
        return func(*args, **kwargs)

    def host_read(func, args, kwargs):
        if is_device(args[0]):
            refuse_unrecorded_sync(f"Tensor.{getattr(func, '__name__', str(func))}()")
            state.notify_sync(getattr(func, "__name__", str(func)), args[0])
            if state.kernel_log is not None:  # a profiler records CUDA activity
                return state.kernel_log.copy("DtoH", False, lambda: func(*args, **kwargs))
        elif state.observers and memory_mark(args[0]) == PINNED:
            state.notify_host_read(getattr(func, "__name__", str(func)), args[0])
        return func(*args, **kwargs)

    def copy_(func, args, kwargs):
        dst, src = args[0], args[1] if len(args) > 1 else kwargs["src"]
        d, s = is_device(dst), is_device(src)
        non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
        if d and not s and isinstance(src, Tensor):
            if state.capturing():
                if memory_mark(src) != PINNED:
                    state.refuse(pageable_copy_refused("Tensor.copy_", tuple(src.shape)))
                elif not non_blocking:
                    state.refuse(blocking_copy_refused("Tensor.copy_", tuple(src.shape), "from"))
            if not non_blocking and src.dim():
                state.flag_host_sync()  # a blocking copy waits for the stream
        elif s and not d:
            if memory_mark(dst) != PINNED:
                return to_host(src, "Tensor.copy_", lambda: func(*args, **kwargs))
            if not non_blocking:
                if state.capturing():
                    state.refuse(blocking_copy_refused("Tensor.copy_", tuple(src.shape), "into"))
                state.notify_sync("Tensor.copy_", src)
                if state.kernel_log is not None:  # a profiler records CUDA activity
                    return state.kernel_log.copy("DtoH", True, lambda: func(*args, **kwargs))
                return func(*args, **kwargs)
            # Into pinned memory, non_blocking: a stream op the host does not wait for (captured,
            # as on CUDA: each replay writes the buffer again).
        barrier = (between_devices(device_indices.index_of(src), device_indices.index_of(dst))
                   if d and s else contextlib.nullcontext())
        with barrier:
            if state.kernel_log is not None and d != s:  # a profiler records CUDA activity
                out = state.kernel_log.copy("HtoD" if d else "DtoH",
                                            memory_mark(dst if s else src) == PINNED,
                                            lambda: func(*args, **kwargs))
            else:
                out = func(*args, **kwargs)
            if (d or s) and state.observers:
                state.notify_op(func, args, kwargs, out)
        return out

    def pin_memory(func, args, kwargs):
        t = args[0]
        if is_device(t):
            raise RuntimeError(f"cannot pin 'torch.cuda.{_type_name(t)}' only dense CPU tensors "
                               f"can be pinned")
        if memory_mark(t) == PINNED:
            return t
        out = t.clone()
        memory.mark_pinned(out)
        return out

    def is_pinned(func, args, kwargs) -> bool:
        return memory_mark(args[0]) == PINNED

    return {
        Tensor.to: to, Tensor.cuda: cuda, Tensor.cpu: cpu, Tensor.numpy: numpy,
        Tensor.__array__: numpy, Tensor.tolist: host_read, Tensor.item: host_read,
        Tensor.__bool__: host_read, Tensor.__int__: host_read, Tensor.__float__: host_read,
        Tensor.__index__: host_read, Tensor.copy_: copy_, Tensor.pin_memory: pin_memory,
        Tensor.is_pinned: is_pinned,
    }


def _type_name(t: Tensor) -> str:
    return {torch.float32: "FloatTensor", torch.float64: "DoubleTensor", torch.float16: "HalfTensor",
            torch.bfloat16: "BFloat16Tensor", torch.int64: "LongTensor", torch.int32: "IntTensor",
            torch.bool: "BoolTensor", torch.uint8: "ByteTensor"}.get(t.dtype, "Tensor")
