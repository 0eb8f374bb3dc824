"""Streams during a capture, as CUDA has them. The capturing stream's work is recorded, and so is
the work of a stream forked into the capture (it waited on the capturing stream, or on an event
recorded on it). Work on any other stream runs at once, outside the graph: the legacy default
stream too, in every capture_error_mode and from any thread, since torch's pooled streams (a
capture's among them) are created cudaStreamNonBlocking and the legacy stream waits only on
blocking streams; a kernel launch is not one of the "potentially unsafe" calls a capture mode
prohibits (measured on an H100, torch 2.11, 2026-12-06: the launch runs once, at capture, and
the capture ends valid). These rules see the thread that began the capture and threads whose work
capture_threads.py routes into it. A stream forked into the capture must be joined back (the
capturing stream waits on it) before the capture ends, or the capture fails with CUDA's
unjoined-work error.
"""

from __future__ import annotations

from typing import Any


import torch

from harness import torch_internals
from harness.torch_internals import TorchDispatchMode, disable_current_modes, tree_flatten
from harness.graphs.base import CaptureError
from harness.emulation.tracking.capture_forks import CaptureForks
from harness.emulation.tracking.capture_races import CaptureRaces
from harness.emulation.tracking.clocks import Clocks
from harness.graphs.emulator.tensor_subclasses import defer_to_subclass



class CaptureStreams(TorchDispatchMode):
    """Pushed above the recorder for one capture; `key(stream)` is the stream's int id."""

    # A higher-order operator is judged by its stream like any op, then left to the recorder.
    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # As the capture's recorder (recorder.CompiledCodeRecorder): torch.compile compiles with
        # every mode off, and the compiled code's ops are judged by their stream here.
        return True

    def __init__(self, state: Any, origin: Any, key, races: CaptureRaces | None = None) -> None:
        super().__init__()
        self.state = state
        self.origin = origin
        self.key = key
        self.races = races
        self.clocks = Clocks() if races is None else races.clocks
        self.forks = CaptureForks(origin, key, self.clocks)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if types and defer_to_subclass(types):
            return NotImplemented  # the subclass's own dispatch first (tensor_subclasses.py)
        kwargs = kwargs or {}
        memory = self.state.memory
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if not (memory.call_targets_device() or any(memory.is_device(t) for t in tensors)):
            return func(*args, **kwargs)  # host work: the recorder's business
        stream = self.state.streams.current()
        if stream in self.state.streams.capturing:
            if self.races is None:
                seq, out = self.forks.launch(stream), func(*args, **kwargs)
            else:
                out = func(*args, **kwargs)
                seq = self.races.op(self.key(stream), func, args, kwargs, out)
            self.forks.ran(stream, seq)
            return out
        # Another stream, not part of the capture (the legacy default stream included): its work
        # runs now and stays out of the graph.
        with disable_current_modes(), torch_internals.DisableTorchFunction():
            return func(*args, **kwargs)

    # --- forks and joins ---------------------------------------------------------------------

    def record_event(self, event: int, stream: Any) -> None:
        self.clocks.record_event(event, self.key(stream))

    def wait_event(self, stream: Any, event: int) -> None:
        self.clocks.wait_event(self.key(stream), event)

    def wait_stream(self, stream: Any, other: Any) -> None:
        self.clocks.wait_stream(self.key(stream), self.key(other))

    def end_error(self) -> CaptureError | None:
        """What ending the capture raises: a fork not joined back to the capturing stream."""
        return self.forks.unjoined_error()


class CaptureRules:
    """The capture's stream rules as an observer of the device: a `CaptureStreams` for each
    capture, told of the forks and joins made during it. Stream tracking (observer.py) holds one;
    a device without tracking (`races="off"` in issue order) is given one of its own, since which
    work a capture records does not depend on whether races are looked for."""

    def __init__(self, state: Any, key, tracker: Any = None) -> None:
        self.state = state
        self.key = key
        self.tracker = tracker  # the device's StreamTracker, where races between branches go
        self.capture: CaptureStreams | None = None

    def on_capture_begin(self, graph, stream, mode: str) -> None:
        races = None if self.tracker is None else CaptureRaces(self.tracker, self.state.memory)
        self.capture = CaptureStreams(self.state, stream, self.key, races)
        self.capture.__enter__()

    def on_capture_end(self, graph, aborted: bool) -> None:
        capture, self.capture = self.capture, None
        if capture is None:
            return
        capture.__exit__(None, None, None)
        if not aborted:
            error = capture.end_error()
            if error is not None:
                raise error

    def on_stream(self, what: str, stream, other) -> None:
        capture = self.capture
        if capture is None:
            return
        if what == "wait_stream":
            capture.wait_stream(stream, other)
        elif what == "wait_event" and other.recorded_on is not None:
            capture.wait_event(stream, other.key)
        elif what == "record_event":
            capture.record_event(other.key, stream)
