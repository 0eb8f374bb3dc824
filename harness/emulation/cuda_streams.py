"""`torch.cuda.Stream`, `torch.cuda.Event` and the current stream, on the emulated device.

Work runs when it is issued (in issue order), so waits and synchronizations have nothing to wait
for yet: each one is reported to the device's observers (state.py), which is where tracking and
an adversarial schedule hook in. The current stream is per thread and per device, as in CUDA; the
default stream of each device has id 0 and `cuda_stream` 0.

`Stream.query()` and `Event.query()` answer from the device's stream tracking: False while the
work they cover waits in a queue (the adversarial schedule, behind `torch.cuda._sleep`), which
then runs, so a polling loop ends; True orders the host after that work, as on CUDA, where a
query's cudaSuccess is the host's proof of completion.

Event timing is emulated: `record()` notes the host's clock (`time.perf_counter`), and because work
is synchronous, `start.elapsed_time(end)` is the host time between the two records in milliseconds:
the time the work issued between them took on the cpu, not what a GPU would take; except that a
`torch.cuda._sleep` keeps its stream busy for its cycles at the SM clock, and the host's waits for
it move the host's clock on without sleeping (device_clock.py).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import torch

from harness.emulation.active import active_state
from harness.emulation.blas_workspaces import PRIORITY_POOLS, STREAMS_PER_POOL
from harness.emulation.capture_syncs import refuse_host_sync
from harness.emulation.capture_waits import refuse_uncaptured_wait
from harness.emulation.device_clock import SM_CLOCK_HZ, DeviceClock
from harness.emulation.rules import (captured_event_used, device_index,
                                     event_recorded_on_another_device,
                                     events_of_two_devices_error, interprocess_timing_event)

_TorchStream = torch.Stream  # torch's own class (the emulation replaces the name while it lasts)
_STREAM_HANDLE_BASE = 0x7E0000  # fake `cuda_stream` handles, distinct from 0 (the default stream)
# (least, greatest) priority, as torch reports it on CUDA: see Stream.__new__
PRIORITY_RANGE = (0, -3)


class Stream:
    """An emulated CUDA stream (torch.cuda.Stream's API)."""

    _pooled = True  # made from CUDA's stream pools (an external stream is not)

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs):
        state = _state()
        if kwargs.keys() - {"stream_id", "device_index", "device_type"}:
            raise TypeError(f"Stream() got unexpected keyword arguments "
                            f"{sorted(kwargs.keys() - {'stream_id', 'device_index', 'device_type'})}; "
                            f"accepted: device, priority")
        self = super().__new__(cls)
        index = state.streams.device_index(device)
        if "stream_id" in kwargs:
            self.stream_id = int(kwargs["stream_id"])
        else:
            self.stream_id = next(state.streams.ids)
        self.device_index = index
        self.device_type = 1  # c10::DeviceType::CUDA
        # torch clamps to its compiled-in priority levels (c10::cuda::max_compile_time_stream_priorities,
        # 4): 0 to -3 whatever the GPU allows (measured on an H100, torch 2.11)
        self._priority = max(PRIORITY_RANGE[1], min(PRIORITY_RANGE[0], int(priority)))
        known = state.streams.by_id.setdefault((self.stream_id, index), self)
        if known is not self:  # a stream made from a known stream's ids is that stream (c10's
            self._priority = known._priority  # unpack3): its priority too, whatever was asked
        # Its cudaStream_t and the queue its work goes to: a stream made from a known stream's id
        # names that stream's (an ExternalStream sets its own after this).
        self._handle = known._handle if known is not self else (
            0 if self.stream_id == 0 else _STREAM_HANDLE_BASE + self.stream_id)
        self._queue_id = known._queue_id if known is not self else self.stream_id
        # Which of CUDA's pooled streams this one is (blas_workspaces.py keys workspaces by it).
        self.pool_slot = None if self.stream_id == 0 or not cls._pooled else (
            known.pool_slot if known is not self else state.streams.next_pool_slot(
                index, self._priority))
        return self

    def __init__(self, device: Any = None, priority: int = 0, **kwargs) -> None:
        pass

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.device_index)

    @property
    def priority(self) -> int:
        return self._priority

    @staticmethod
    def priority_range() -> tuple[int, int]:
        return PRIORITY_RANGE

    @property
    def cuda_stream(self) -> int:
        return self._handle

    @property
    def queue(self) -> tuple[int, int]:
        """(device, queue id): the CUDA queue this stream's work goes to, what the device's
        ordering, captures, clocks and race tracking key on. A stream's own id, except for an
        ExternalStream over another stream's handle: CUDA gives that wrapper a stream id of its
        own (it compares unequal), but its work goes to the one cudaStream_t."""
        return (self.device_index, self._queue_id)

    def query(self) -> bool:
        state = _state()
        refuse_host_sync(state, "Stream.query()", stream=self)
        tracking = state.streams_tracking
        done = True if tracking is None else tracking.query_stream(self)
        if done:  # the host saw the stream's work done: its clock is past that work's end
            state.streams.clock.host_waits_for_stream(self)
        return done

    def is_capturing(self) -> bool:
        """Whether this stream takes part in the capture in progress."""
        state = _state()
        return state.capture is not None and self in state.streams.capturing

    def synchronize(self) -> None:
        state = _state()
        refuse_host_sync(state, "Stream.synchronize()", stream=self)
        state.flag_host_sync()  # CUDA flags a stream's sync; its device and event syncs not
        state.notify_stream("synchronize", self, None)
        state.streams.clock.host_waits_for_stream(self)

    def wait_event(self, event: "Event") -> None:
        state = _state()
        refuse_uncaptured_wait(state, self, event=event, what="Stream.wait_event()")
        event.refuse_outside_its_capture(state, "Stream.wait_event()")
        state.streams.joins(self, event.recorded_on)
        state.notify_stream("wait_event", self, event)
        if event._time is not None:
            state.streams.clock.wait_until(self, event._time)

    def wait_stream(self, stream: "Stream") -> None:
        state = _state()
        stream = as_device_stream(stream)
        refuse_uncaptured_wait(state, self, other=stream, what="Stream.wait_stream()")
        state.streams.joins(self, stream)
        state.notify_stream("wait_stream", self, stream)
        state.streams.clock.wait_until(self, state.streams.clock.busy_until(stream))

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = Event() if event is None else event
        event.record(self)
        return event

    def __enter__(self) -> "Stream":
        # torch.Stream's own protocol (torch/csrc/Stream.cpp): the stream and its device are
        # current inside, what was current comes back at exit. nn.parallel_apply enters each
        # replica's stream so.
        context = torch.cuda.StreamContext(self)
        context.__enter__()
        self.__dict__.setdefault("_entered", []).append(context)
        return self

    def __exit__(self, *exc) -> None:
        self.__dict__["_entered"].pop().__exit__(*exc)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Stream) and self.stream_id == other.stream_id
                and self.device_index == other.device_index)

    def __hash__(self) -> int:
        return hash((self.stream_id, self.device_index))

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream device={self.device} cuda_stream={self.cuda_stream:#x}>"


class ExternalStream(Stream):
    """torch.cuda.ExternalStream: a stream named by a handle someone else made. As on CUDA its
    stream id is the handle itself (c10 encodes an external stream's id as its pointer), so it
    compares unequal to a torch stream whose `cuda_stream` it wraps and equal to another wrapper
    of the handle. Its work goes to the queue that handle is (`Stream.queue`): a torch stream's
    own handle (an application handing `stream.cuda_stream` back, OpenMM or Warp sharing torch's
    stream) names that stream's queue, whose work it is ordered with and whose capture it joins,
    and two wrappers of one foreign handle share one queue."""

    _pooled = False

    def __new__(cls, stream_ptr: int, device: Any = None, **kwargs):
        handle = int(stream_ptr)
        streams = _state().streams
        if handle == 0:
            # THCPStream_pynew reads a null pointer as none given: getStreamFromPool, a pooled
            # stream of the low-priority pool whose cuda_stream is its own nonzero handle
            # (measured on an H100, torch 2.11: 0x3c7d2a40), as torch.cuda.Stream() makes
            self = Stream.__new__(cls, device)
            self.pool_slot = streams.next_pool_slot(self.device_index, self._priority)
            return self
        queue_id = streams.queue_of_handle(handle, streams.device_index(device))
        self = Stream.__new__(cls, device, stream_id=handle)
        self._queue_id = queue_id
        queue = streams.by_id.get((queue_id, self.device_index))
        if queue is not None and queue is not self:  # a torch stream's: its slot, priority
            self.pool_slot, self._priority = queue.pool_slot, queue._priority
        self._handle = handle
        return self

    def __init__(self, stream_ptr: int, device: Any = None, **kwargs) -> None:
        pass


class Event:
    """An emulated CUDA event (torch.cuda.Event's API); see the module docstring for its time."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, external: bool = False) -> None:
        self.enable_timing = bool(enable_timing)
        self.blocking = bool(blocking)
        self.interprocess = bool(interprocess)
        self.external = bool(external)  # waited on in a capture as an external-event node
        # The emulator's own name for the event (stream tracking keys on it); CUDA's handle,
        # `cuda_event`/`event_id`, is 0 until the first record creates the event.
        self.key = next(_state().streams.event_ids)
        self.recorded_on: Stream | None = None
        self.made_for: torch.device | None = None  # torch.Event(device): known from the start
        self._time: float | None = None
        # The capture its last record went into (not an external event's): outside that capture
        # CUDA refuses the event's use (measured on an H100: "invalid argument").
        self._captured_by = None

    @property
    def cuda_event(self) -> int:
        return 0 if self.recorded_on is None else self.key

    @property
    def event_id(self) -> int:
        return self.cuda_event

    @property
    def device(self) -> torch.device | None:
        """The device a `torch.Event` was made for; a `torch.cuda.Event`'s is its first record's
        stream's (None before: CUDA makes the event at its first record)."""
        if self.made_for is not None:
            return self.made_for
        return None if self.recorded_on is None else torch.device("cuda", self.recorded_on.device_index)

    def record(self, stream: Stream | None = None) -> None:
        if self.recorded_on is None and self.interprocess and self.enable_timing:
            raise interprocess_timing_event("Event.record()")  # the event is made here
        state = _state()
        stream = state.streams.current() if stream is None else as_device_stream(stream)
        if self.recorded_on is not None and self.recorded_on.device_index != stream.device_index:
            raise event_recorded_on_another_device(self.recorded_on.device_index,
                                                   stream.device_index, self.made_for is not None)
        self.recorded_on = stream
        self._time = state.streams.clock.record(stream)
        self._captured_by = None
        if state.stream_captures(stream):
            state.capture.note_recorded_event(self)
            if not self.external:
                self._captured_by = state.capture
        state.notify_stream("record_event", stream, self)

    def wait(self, stream: Stream | None = None) -> None:
        stream = _state().streams.current() if stream is None else as_device_stream(stream)
        stream.wait_event(self)

    def query(self) -> bool:
        return self._query("Event.query()")

    def refuse_outside_its_capture(self, state, what: str) -> None:
        if self._captured_by is not None and self._captured_by is not state.capture:
            raise captured_event_used(what)

    def _query(self, what: str) -> bool:
        state = _state()
        refuse_host_sync(state, what, event=self)
        self.refuse_outside_its_capture(state, what)
        tracking = state.streams_tracking
        done = True if tracking is None else tracking.query_event(self)
        if done and self._time is not None:
            state.streams.clock.host_waits(self._time)
        return done

    def synchronize(self) -> None:
        state = _state()
        refuse_host_sync(state, "Event.synchronize()", event=self)
        self.refuse_outside_its_capture(state, "Event.synchronize()")
        state.notify_stream("event_synchronize", self.recorded_on, self)
        if self._time is not None:
            state.streams.clock.host_waits(self._time)

    def elapsed_time(self, end_event: "Event") -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if self._time is None or end_event._time is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        # torch's CUDAEvent::elapsed_time queries both events first: refused during a capture
        # that recorded one (cudaErrorCapturedEvent), an error while their work is queued.
        what = "Event.elapsed_time()"
        if not (self._query(what) and end_event._query(what)):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        if self.recorded_on.device_index != end_event.recorded_on.device_index:
            raise events_of_two_devices_error(self.recorded_on.device_index,
                                              end_event.recorded_on.device_index)
        return (end_event._time - self._time) * 1e3

    def ipc_handle(self):
        if self.recorded_on is None and self.interprocess and self.enable_timing:
            raise interprocess_timing_event("Event.ipc_handle()")
        raise NotImplementedError("Event.ipc_handle() is not supported on the emulated CUDA device "
                                  "(one process, no interprocess events)")

    @classmethod
    def from_ipc_handle(cls, device, handle) -> "Event":
        # torch.cuda.Event's own classmethod; without it the call was an AttributeError
        raise NotImplementedError("Event.from_ipc_handle() is not supported on the emulated CUDA "
                                  "device (one process, no interprocess events)")

    def __repr__(self) -> str:
        return f"<torch.cuda.Event {self.key:#x}>" if self.recorded_on else "<torch.cuda.Event uninitialized>"


class _ThreadStreams(threading.local):
    """A thread's current stream per device and their keys (`Streams.current_key`), None until
    set: class defaults, so the hot path's read on a thread that set none is an attribute read,
    not a failed lookup."""

    current: dict | None = None
    keys: dict | None = None


class Streams:
    """Each thread's current stream per device, the default streams, and which streams have
    joined a capture (by waiting on the capturing stream or an event recorded on it)."""

    def __init__(self, state) -> None:
        self._state = state
        self.ids = itertools.count(1)
        self.event_ids = itertools.count(1)
        self._local = _ThreadStreams()
        # The stream tracking's int key of a stream (observer.py sets it): `current_key` keeps
        # the current stream's key per thread and device, forgotten when another is made current.
        self.key_of: Any = None
        self._defaults: dict[int, Stream] = {}
        self.by_id: dict[tuple[int, int], Stream] = {}  # what torch._C._cuda_setStream names
        self._wrapped: dict[tuple[int, int], int] = {}  # (foreign handle, device) -> queue id
        self.capturing = CaptureQueues()
        self._made_at: dict[tuple[int, int], int] = {}  # (device, priority pool) -> streams made
        # event timing's clock: the host's, and the streams a torch.cuda._sleep keeps busy
        self.clock = DeviceClock(SM_CLOCK_HZ)

    def queue_of_handle(self, handle: int, device: int) -> int:
        """The queue id of the non-null `handle` on `device`: a torch stream's own id when the
        handle is that stream's `cuda_stream`, else the id the handle was given when first
        wrapped (a new one now: the program is about to use a stream)."""
        own = self.by_id.get((handle - _STREAM_HANDLE_BASE, device))
        if own is not None and own.cuda_stream == handle:
            return own._queue_id
        key = (handle, device)
        if key not in self._wrapped:
            self._wrapped[key] = next(self.ids)
        return self._wrapped[key]

    def next_pool_slot(self, device: int, priority: int) -> tuple[int, int]:
        """The (priority pool, index) of CUDA's pooled stream that a new stream of `priority`
        gets: each pool hands its 32 streams out in turn (c10's CUDAStream.cpp)."""
        pool = min(-priority, PRIORITY_POOLS - 1)
        made = self._made_at.get((device, pool), 0)
        self._made_at[(device, pool)] = made + 1
        return (pool, made % STREAMS_PER_POOL)

    def device_index(self, device: Any) -> int:
        state = self._state
        return device_index(device, state.current_index, state.properties.count)

    def default(self, device: Any = None) -> Stream:
        index = self.device_index(device)
        stream = self._defaults.get(index)
        if stream is None:
            stream = self._defaults[index] = Stream(index, stream_id=0)
        return stream

    def _current_map(self) -> dict[int, Stream]:
        current = self._local.current
        if current is None:
            current = self._local.current = {}
        return current

    def current(self, device: Any = None) -> Stream:
        index = self._state.current_index if device is None else self.device_index(device)
        # The hot path (every tracked op asks it): the thread's map read without making it.
        current = self._local.current
        return (current and current.get(index)) or self._defaults.get(index) or self.default(index)

    def current_key(self) -> int:
        """`key_of` the current stream on the current device: asked at every tracked op, so kept
        in the thread's map of keys until `set_current` makes another stream current."""
        keys = self._local.keys
        if keys is None:
            keys = self._local.keys = {}
        index = self._state.current_index
        key = keys.get(index)
        if key is None:
            key = keys[index] = self.key_of(self.current(index))
        return key

    def set_current(self, stream: Stream) -> None:
        self._current_map()[stream.device_index] = stream
        keys = self._local.keys
        if keys is not None:
            keys.pop(stream.device_index, None)

    def joins(self, stream: Stream, other: Stream | None) -> None:
        """`stream` waited for `other`: during a capture it joins it when `other` captures."""
        if other is not None and other in self.capturing:
            self.capturing.add(stream)

    def record_stream(self, tensor: torch.Tensor, stream: Stream) -> None:
        self._state.notify_stream("record_stream", stream, tensor)


class CaptureQueues:
    """The queues taking part in a capture: a stream is in it when its queue is (`Stream.queue`),
    so a wrapper of the capturing stream's handle captures, as CUDA captures the cudaStream_t."""

    def __init__(self, streams: tuple = ()) -> None:
        self._queues = {stream.queue for stream in streams}

    def __contains__(self, stream: object) -> bool:
        return getattr(stream, "queue", None) in self._queues

    def add(self, stream: Stream) -> None:
        self._queues.add(stream.queue)


def as_plain_stream(stream: Stream) -> Stream:
    """A new `torch.cuda.Stream` object naming `stream`, as torch's `current_stream()`,
    `default_stream()` and `get_stream_from_external()` build one from the c10 stream's ids at
    each call: equal to `stream`, a plain Stream though `stream` is an ExternalStream, and never
    the object that was made current."""
    return Stream(stream.device_index, stream_id=stream.stream_id)


def queue_of(stream: Any) -> tuple[int, int]:
    """(device, queue id) of `stream` (`Stream.queue`); a `torch.Stream` naming a device stream
    is that stream's, one made from ids alone its own id's."""
    queue = getattr(as_device_stream(stream), "queue", None)
    return queue if queue is not None else (int(stream.device_index), int(stream.stream_id))


def as_device_stream(stream: Any) -> Any:
    """A `torch.Stream` naming a CUDA stream (what `torch.accelerator.current_stream()` gives, or
    one made from ids) as the device's Stream of that id, where the device's calls take one as
    CUDA's take either; anything else as it is."""
    if stream is None or isinstance(stream, Stream) or not isinstance(stream, _TorchStream):
        return stream
    if stream.device_type != 1:  # c10::DeviceType::CUDA
        return stream
    known = getattr(stream, "device_stream", None)
    if known is not None:
        return known
    streams = getattr(_state(), "streams", None)
    if streams is None:  # the graph sanitizer: its streams are CUDA's own
        return stream
    found = streams.by_id.get((stream.stream_id, stream.device_index))
    return found if found is not None else Stream(stream.device_index, stream_id=stream.stream_id)


def _state():
    return active_state()
