"""Race tracking over a real GPU's streams, as PyTorch's CSAN (torch/cuda/_sanitizer.py) does: a
dispatch mode tells the tracker (tracker.py) each op's reads and writes of CUDA memory on the
current stream, and the stream and event API's waits, records and synchronizations become the
tracker's edges. The emulated device tracks its streams itself (observer.py); this is for real
CUDA, natively or under the graph sanitizer, where the GPU runs the streams and only their order
can be checked, not their timing.

What it does not see, as CSAN does not: frees (a tensor dropped while another stream reads it:
use `record_stream`), CUDA's own graph replays (the sanitizer's go through the dispatcher and are
seen, each launch of a graph ordered behind its previous one as cudaGraphLaunch orders it, and
each of their ops named `replay of CUDAGraph 0x... (op)`), and kernels
that skip the dispatcher (Triton launched directly, NCCL's own streams). Unlike CSAN it takes a
`query()` answering True as the synchronization it is (a polling loop's read after it is ordered).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch

from harness import torch_internals
from harness.torch_internals import TorchDispatchMode
from harness.graphs.emulator import opinfo
from harness.graphs.emulator.accesses import higher_order_tensors, split_accesses, tensors_of
from harness.graphs.emulator.callsite import current_callsite
from harness.graphs.emulator.opinfo import OpKind
from harness.emulation.replacing import apply
from harness.emulation.tracking.names import label_of, storage_key
from harness.emulation.tracking.tracker import StreamTracker
from harness.graphs.emulator.tensor_subclasses import defer_to_subclass

__harness_machinery__ = True  # its frames are not the program's callers (callsite.py)

_LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default
_TO_COPY = torch.ops.aten._to_copy.default
_COPY = torch.ops.aten.copy_.default
# Its schema marks the tensor mutable, but it touches no memory: it tells the allocator that a
# stream uses the block (CUDA's own sanitizer passes it too).
_RECORD_STREAM = torch.ops.aten.record_stream.default
_HigherOrderOperator = torch_internals.HigherOrderOperator


def queue_key(stream: Any) -> tuple:
    """The CUDA queue a stream object names: (device, its cudaStream_t). An ExternalStream over a
    torch stream's handle is that stream (CUDA gives it another stream id); a `torch.Stream` is
    the CUDA stream of its id; an object with neither handle nor device type is named by its id."""
    handle = getattr(stream, "cuda_stream", None)
    if handle is None and hasattr(stream, "device_type"):
        handle = torch.cuda.Stream(stream_id=stream.stream_id, device_index=stream.device_index,
                                   device_type=stream.device_type).cuda_stream
    if handle is None:
        return (int(stream.device_index), "id", int(stream.stream_id))
    return (int(stream.device_index), int(handle))


class StreamIds:
    """Small ints for real streams, each device's default stream first: what reports call
    "stream N" (CUDA's own stream ids are pool encodings, not names a reader can follow)."""

    def __init__(self) -> None:
        self._ids: dict[tuple, int] = {}  # queue_key -> its small int

    def of(self, stream: Any) -> int:
        key = queue_key(stream)
        if key not in self._ids:
            self._ids[key] = len(self._ids)
        return self._ids[key]


def _is_cuda(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and not t.is_meta


def host_waits(func, args: tuple, kwargs: dict) -> bool:
    """A blocking copy to the host or a scalar read: the host waits for the current stream."""
    if func is _LOCAL_SCALAR:
        return True
    if func is _TO_COPY:
        device = kwargs.get("device")
        return device is not None and torch.device(device).type == "cpu" and not kwargs.get("non_blocking")
    if func is _COPY:
        return (isinstance(args[0], torch.Tensor) and args[0].device.type == "cpu"
                and not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False)))
    return False


class RealStreamWork(TorchDispatchMode):
    # Higher-order operators (flex attention's, torch.cond) reach __torch_dispatch__ as one call.
    supports_higher_order_operators = True

    def __init__(self, tracker: StreamTracker, ids: StreamIds) -> None:
        super().__init__()
        self.tracker, self.ids = tracker, ids
        # Per thread, the graph whose replay is running (`CUDAGraph 0x...`): the graph
        # sanitizer's replays reach the dispatcher, and a report names the replay as the emulated
        # device's does ("replay of CUDAGraph 0x..."), with the replayed op.
        self._replays = threading.local()
        self._untracked = 0  # inside `untracked()`

    @contextlib.contextmanager
    def untracked(self) -> Iterator[None]:
        """The harness's own bookkeeping on the GPU (a generator's graph holders): run, judged
        by nobody (no user code can reach its memory to order it)."""
        self._untracked += 1
        try:
            yield
        finally:
            self._untracked -= 1

    @property
    def replaying(self) -> str | None:
        return getattr(self._replays, "graph", None)

    @replaying.setter
    def replaying(self, graph: str | None) -> None:
        self._replays.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if types and defer_to_subclass(types):
            return NotImplemented  # the subclass's own dispatch first (tensor_subclasses.py)
        kwargs = kwargs or {}
        if _capturing() or func is _RECORD_STREAM or self._untracked:
            return func(*args, **kwargs)  # captured work runs only at replay
        if isinstance(func, _HigherOrderOperator):
            return self._higher_order_op(func, args, kwargs)
        kind = opinfo.op_kind(func)
        if kind is OpKind.VIEW:
            return func(*args, **kwargs)
        # Host work passes; a factory (`torch.empty(..., device="cuda")`, a copy to the device)
        # still makes fresh device memory below, which may be a freed block handed out again.
        stream = self.ids.of(torch.cuda.current_stream())
        reads, writes = split_accesses(func, args, kwargs, _is_cuda)
        where, name = current_callsite(), self._named(opinfo.op_name(func))
        for t in (*reads, *writes):
            self.tracker.labels.setdefault(storage_key(t), label_of(t))
        seq = self.tracker.launch(stream, [storage_key(t) for t in reads], [storage_key(t) for t in writes],
                                  op=name, where=where)
        out = func(*args, **kwargs)
        if host_waits(func, args, kwargs):
            self.tracker.synchronize_stream(stream)
        if kind is not OpKind.MUTATING:
            for t in tensors_of(out if isinstance(out, (list, tuple)) else (out,)):
                if _is_cuda(t) and t.untyped_storage().nbytes():
                    # Fresh memory (perhaps a freed block again): written by this op only.
                    self.tracker.record_write(storage_key(t), stream, seq, op=name, where=where)
                    self.tracker.labels[storage_key(t)] = label_of(t)
        return out

    def _named(self, op: str) -> str:
        return op if self.replaying is None else f"replay of {self.replaying} ({op})"

    def _higher_order_op(self, func, args: tuple, kwargs: dict) -> Any:
        """One kernel on the current stream reading every CUDA tensor it is given; what it runs
        inside goes below this mode, so a write into an operand is not seen."""
        stream = self.ids.of(torch.cuda.current_stream())
        reads = [t for t in higher_order_tensors(args, kwargs) if _is_cuda(t)]
        where, name = current_callsite(), self._named(f"{func.name()} (a higher-order op)")
        for t in reads:
            self.tracker.labels.setdefault(storage_key(t), label_of(t))
        seq = self.tracker.launch(stream, [storage_key(t) for t in reads], [], op=name, where=where)
        out = func(*args, **kwargs)
        for t in higher_order_tensors((out,), {}):
            if _is_cuda(t) and t.untyped_storage().nbytes():
                self.tracker.record_write(storage_key(t), stream, seq, op=name, where=where)
                self.tracker.labels[storage_key(t)] = label_of(t)
        return out


def _capturing() -> bool:
    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except RuntimeError:
        return False


def _api_patches(work: RealStreamWork) -> list[tuple[Any, str, Any]]:
    """The stream and event API's edges: Stream.wait_stream and wait_event go through Event.record
    and Event.wait (torch/cuda/streams.py), so those two carry every fork and join."""
    tracker, ids = work.tracker, work.ids
    Stream, Event = torch.cuda.Stream, torch.cuda.Event
    record, wait = Event.record, Event.wait
    stream_sync, event_sync = Stream.synchronize, Event.synchronize
    stream_query, event_query = Stream.query, Event.query
    torch_C = torch_internals.torch_namespace("torch._C")
    device_sync = getattr(torch_C, "_cuda_synchronize")

    def record_event(self, stream=None) -> None:
        record(self, stream)
        tracker.record_event(id(self), ids.of(torch.cuda.current_stream() if stream is None else stream))

    def wait_event(self, stream=None) -> None:
        wait(self, stream)
        tracker.wait_event(ids.of(torch.cuda.current_stream() if stream is None else stream), id(self))

    def synchronize_stream(self) -> None:
        stream_sync(self)
        tracker.synchronize_stream(ids.of(self))

    def synchronize_event(self) -> None:
        event_sync(self)
        tracker.synchronize_event(id(self))

    def synchronize_device() -> None:
        device_sync()
        tracker.synchronize_device()

    # A query answering True is the host's proof that the work completed, as a synchronize is
    # (a polling loop); CSAN does not trace queries, which would report the read after it.
    def query_stream(self) -> bool:
        done = stream_query(self)
        if done and not _capturing():
            tracker.synchronize_stream(ids.of(self))
        return done

    def query_event(self) -> bool:
        done = event_query(self)
        if done and not _capturing():
            tracker.synchronize_event(id(self))
        return done

    graph_class = torch.cuda.CUDAGraph
    replay = graph_class.replay

    # CUDA orders each launch of an executable graph behind its previous launch, whatever the
    # stream (cudaGraphLaunch): a private event per graph, keyed apart from Python event ids,
    # carries that edge. The replay's own accesses are seen only where they reach the
    # dispatcher (the graph sanitizer's replays), not in CUDA's.
    def replay_in_launch_order(self) -> None:
        stream = ids.of(torch.cuda.current_stream())
        tracker.wait_event(stream, -id(self))
        outer, work.replaying = work.replaying, f"CUDAGraph {id(self):#x}"
        try:
            replay(self)
        finally:
            work.replaying = outer
        tracker.record_event(-id(self), stream)

    return [(graph_class, "replay", replay_in_launch_order),
            (Event, "record", record_event), (Event, "wait", wait_event),
            (Stream, "synchronize", synchronize_stream), (Event, "synchronize", synchronize_event),
            (Stream, "query", query_stream), (Event, "query", query_event),
            (torch_C, "_cuda_synchronize", synchronize_device)]


@contextlib.contextmanager
def track_real_streams(*, races: str = "strict") -> Iterator[StreamTracker]:
    """Track races over the real GPU's streams for the duration; yields the tracker
    (`tracker.reports` in races="report" mode; "strict" raises RaceError at the op)."""
    tracker = StreamTracker(mode=races)
    ids = StreamIds()
    ids.of(torch.cuda.default_stream())  # stream 0, as on the emulated device
    work = RealStreamWork(tracker, ids)
    with contextlib.ExitStack() as stack:
        apply(_api_patches(work), stack)
        stack.enter_context(work)
        _TRACKING.append(work)
        try:
            yield tracker
        finally:
            _TRACKING.remove(work)


# The real streams' tracking in force, innermost last: the graph sanitizer judges the branches of
# its captures against it (its captured ops never reach RealStreamWork as work: see `capturing`).
_TRACKING: list[RealStreamWork] = []


def tracking_in_force() -> RealStreamWork | None:
    """The innermost `track_real_streams()` in force, None outside one."""
    return _TRACKING[-1] if _TRACKING else None
