"""Stream tracking and the schedules on the emulated CUDA device: an observer of its state
(device/state.py's interface) that turns its streams, events, host reads and replays into
`AsyncWork` calls, with stream ids made of the device index and the stream's id."""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from harness import torch_internals
from harness.graphs.emulator.callsite import callsite_later, current_callsite
from harness.emulation.cuda_streams import queue_of
from harness.emulation.tracking.capture_streams import CaptureRules, CaptureStreams
from harness.emulation.tracking.names import name_tensors
from harness.emulation.tracking.races import RaceError
from harness.emulation.tracking.work import AsyncWork

RACE_MODES = ("strict", "report", "off")


_STREAM_ID_BITS = 40


def stream_key(stream: Any) -> int:
    """The int naming `stream`'s queue (a wrapper of a stream's handle is that stream's)."""
    device, queue = queue_of(stream)
    return (device << _STREAM_ID_BITS) | queue


def _current_key(state: Any) -> Callable[[], int]:
    """`stream_key` of the current stream, asked at every tracked op: the device's streams keep
    it per thread and device while that stream stays current."""
    state.streams.key_of = stream_key
    return state.streams.current_key


def _is_default_stream(key: int) -> bool:
    return key & ((1 << _STREAM_ID_BITS) - 1) == 0


class DeviceStreams:
    """Observer of one emulated device: `work` holds the tracker (`work.tracker.reports`)."""

    def __init__(self, state: Any, *, schedule: str, races: str) -> None:
        self.state = state
        lazy = schedule == "issue_order"
        self.work = AsyncWork(state.memory, _current_key(state),
                              state.capturing, schedule=schedule, races=races, lazy=lazy)
        if not lazy:  # active from the start (the session enters `work`): no `_start` comes
            self.state.call_runner = self.work.calls.run
        self.capture_rules = CaptureRules(state, stream_key, self.work.tracker)
        self._pending_activation = False
        # One private event per executable graph: CUDA orders each launch of a graphExec behind
        # its previous launch, whatever the stream (cudaGraphLaunch), so the replay waits on it.
        self._launches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._watch_for_asynchrony()

    def _watch_for_asynchrony(self) -> None:
        """Until the program leaves the default stream or pins memory, every op is ordered with
        the host and nothing can race: the dispatch mode waits for the first sign."""
        streams, memory = self.state.streams, self.state.memory
        set_current, mark_pinned = streams.set_current, memory.mark_pinned

        def set_current_watched(stream) -> None:
            if stream.stream_id != 0:
                self.activate()
            set_current(stream)

        def mark_pinned_watched(t) -> None:
            self.activate()
            mark_pinned(t)

        def ids_watched(ids):
            for stream_id in ids:  # a stream is made: the program is about to use it
                self.activate()
                yield stream_id

        streams.set_current = set_current_watched
        memory.mark_pinned = mark_pinned_watched
        streams.ids = ids_watched(streams.ids)

    def activate(self) -> None:
        if self.work.active:
            return
        if self.capture is not None:
            self._pending_activation = True  # not above the recorder: after the capture
            return
        self._start()

    def _start(self) -> None:
        self.work.activate()
        # The placement mode's device calls go through the tracking's learned call patterns.
        self.state.call_runner = self.work.calls.run

    # --- device/state.py's observer interface ------------------------------------------------

    def on_sync(self, what: str, tensor, stream) -> None:
        if tensor is None:
            self.work.synchronize_device()
        else:
            self.work.synchronize_stream(stream_key(stream))

    def on_host_read(self, what: str, tensor) -> None:
        self.work.host_reads(tensor, f"Tensor.{what} on the host", current_callsite())

    def untracked(self):
        """The device's own bookkeeping, which no race is judged on (StreamWork.untracked)."""
        return self.work.mode.untracked()

    @property
    def capture(self) -> CaptureStreams | None:
        """The capture under way's stream rules, None outside a capture."""
        return self.capture_rules.capture

    def on_capture_begin(self, graph, stream, mode: str) -> None:
        self.capture_rules.on_capture_begin(graph, stream, mode)

    def on_capture_end(self, graph, aborted: bool) -> None:
        try:
            self.capture_rules.on_capture_end(graph, aborted)
        finally:
            if self._pending_activation:
                self._pending_activation = False
                self._start()

    def on_stream(self, what: str, stream, other) -> None:
        if what == "sleep":
            if not self.state.capturing():
                self.activate()
                self.work.sleep(stream_key(stream), where=current_callsite(), cycles=other or 0)
            return
        if self.capture is not None:
            self.capture_rules.on_stream(what, stream, other)
            return  # inside a capture nothing runs: fork and join are the capture's business
        self.activate()
        work = self.work
        if what == "wait_stream":
            work.wait_stream(stream_key(stream), stream_key(other))
        elif what == "wait_event":
            if other.recorded_on is not None:
                work.wait_event(stream_key(stream), other.key)
        elif what == "record_event":
            work.record_event(other.key, stream_key(stream))
        elif what == "synchronize":
            work.synchronize_stream(stream_key(stream))
        elif what == "event_synchronize":
            if other.recorded_on is not None:
                work.synchronize_event(other.key)
        elif what == "record_stream":
            work.record_stream(other, stream_key(stream))
        elif what == "storage_resize":
            work.run_ahead_of_the_host(stream_key(stream))

    def issue_replay(self, graph, recording, run, stream) -> None:
        # Cut at the call: freed or moved memory raises here (also memory the caller freed that
        # only queued work still keeps alive), and a graph reset while its replay is still queued
        # runs what was launched, as CUDA finishes a launch of a destroyed graph.
        # The launch's checks read data pointers of the captured tensors, which the placement
        # mode would take for device calls of the user's.
        holds = self.work.mode.holds
        with torch_internals.DisableTorchFunction():
            cut = recording.replay_in_steps(holds.caller_dropped if holds else None)

        def steps() -> list:
            def without_torch_function(step):
                def run_step() -> None:
                    with torch_internals.DisableTorchFunction():
                        step()
                return run_step
            return [without_torch_function(step) for step in cut()]

        segments = getattr(graph, "replay_segments", ())
        for *_, event in segments:
            if event is not None:
                event.recorded_on = stream  # the replay records the graph's event node
        key = stream_key(stream)
        launched = self._launches.get(recording)
        if launched is not None:
            self.work.wait_event(key, launched)
        else:
            launched = self._launches[recording] = next(self.state.streams.event_ids)
        self.work.replay(key, recording.reads, recording.writes,
                         lambda: run(recording), name=f"CUDAGraph {id(graph):#x}",
                         where=callsite_later(), hold=recording.external_storages, steps=steps,
                         segments=[(reads, writes, None if event is None else event.key)
                                   for reads, writes, event in segments])
        self.work.record_event(launched, key)

    # --- naming --------------------------------------------------------------------------------

    def name_tensors(self, obj: Any, root: str = "") -> None:
        """Reports name the tensors reachable from `obj` by their path (`engine.staging`)."""
        self.work.tracker.labels.update(name_tensors(obj, root))

    @property
    def reports(self) -> list:
        return self.work.tracker.reports

    @property
    def patterned_calls(self) -> int:
        """Device calls tracked through a learned call pattern, without dispatching their aten
        ops to the stream mode (call_patterns.py)."""
        return self.work.calls.used

    def take_late_races(self, *, test_ended: bool = False) -> list:
        """Strict races found where raising was impossible and not raised yet; the caller raises
        them where they belong (pytest: at the end of the test that caused them, not in the next
        test's first op). `test_ended`: a test and its teardown are over, and blocks it freed on a
        device's default stream while another stream's access was pending are judged now, as the
        next test's first allocation there would meet them (it cannot know to wait)."""
        late = self.work.mode.take_late()
        if test_ended:
            tracker = self.work.tracker
            for stream in filter(_is_default_stream, tracker.streams_with_frees()):
                while True:  # strict mode raises one race per call; each leaves its block
                    try:
                        tracker.frees_left_on(stream, op="the next test's allocations (this "
                                                         "test ended)")
                        break
                    except RaceError as race:
                        late.append(race)
        return late

    # --- what the device's stream and event API asks ------------------------------------------

    def stream_done(self, stream) -> bool:
        return self.work.stream_done(stream_key(stream))

    def event_done(self, event) -> bool:
        return self.work.event_done(event.key)

    def query_stream(self, stream) -> bool:
        """`Stream.query()`: True once everything issued to `stream` ran, and then the host is
        ordered after that work, as after `synchronize()` (cudaStreamQuery's cudaSuccess is
        the host's proof of completion). Queued work answers False once, then runs."""
        if not self.work.active or self.capture is not None:
            # Nothing was ever queued (every op ran in order with the host), or a capture is
            # under way, where nothing runs and a synchronization is not tracked either.
            return True
        return self.work.poll_stream(stream_key(stream))

    def query_event(self, event) -> bool:
        """`Event.query()`, as `query_stream` for the work recorded before `event`."""
        if not self.work.active or self.capture is not None or event.recorded_on is None:
            return True
        return self.work.poll_event(event.key)
