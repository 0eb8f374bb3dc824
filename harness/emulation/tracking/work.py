"""Asynchrony for a device: the tracker, the schedule and the dispatch mode together, and the
calls a device's stream, event and graph API makes into them (stream and event ids are ints).

    work = AsyncWork(memory, current_stream_id, capturing, schedule="adversarial", races="report")
    with work:
        ...  # device ops go to the current stream
    work.tracker.reports  # the races found (races="strict" raises the first instead)

Leaving the context runs every queued op (as a device synchronization would), so nothing issued
is lost; the races found are the tracker's.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator

import torch

from harness import torch_internals
from harness.torch_internals import (TorchDispatchMode, disable_current_modes,
                                     get_current_dispatch_mode_stack, pop_mode, push_mode)
from harness.graphs.emulator.dispatch_keys import keep_modes_reachable
from harness.emulation.tracking.call_patterns import CallPatterns
from harness.emulation.tracking.mode import StreamWork
from harness.emulation.tracking.names import label_of, storage_key
from harness.emulation.tracking.schedule import Schedule, Stepped
from harness.emulation.tracking.tracker import StreamTracker


@contextlib.contextmanager
def _outside_modes() -> Iterator[None]:
    """Queued work runs as the device would run it: aten calls on the memory they were issued
    with, not seen again by any dispatch or function mode (the device's placement included)."""
    with disable_current_modes(), torch_internals.DisableTorchFunction():
        yield


def _remove_dispatch_mode(mode: TorchDispatchMode) -> None:
    """Pop `mode` off the dispatch-mode stack wherever it is, keeping the modes above it."""
    above = []
    while get_current_dispatch_mode_stack():
        top = pop_mode()
        if top is mode:
            break
        above.append(top)
    for m in reversed(above):
        push_mode(m)


def _enter_below_all(mode: TorchDispatchMode) -> None:
    """Enter `mode` at the bottom of the dispatch-mode stack, keeping the modes above it."""
    above = []
    while get_current_dispatch_mode_stack():
        above.append(pop_mode())
    mode.__enter__()
    for m in reversed(above):
        push_mode(m)


class AsyncWork:
    """`lazy`: the dispatch mode goes in only at `activate()` (the first sign of asynchrony: a
    second stream, pinned memory, `_sleep`), so code that never leaves the default stream runs
    without a Python call per aten op; a replay is tracked either way."""

    def __init__(self, memory: Any, stream: Callable[[], int], capturing: Callable[[], bool], *,
                 schedule: str = "issue_order", races: str = "strict", lazy: bool = False) -> None:
        self.tracker = StreamTracker(mode=races)
        self.schedule = Schedule(schedule)
        self.mode = StreamWork(memory, stream, capturing, self.tracker, self.schedule)
        # The device's placement mode runs its device calls through `calls.run` (observer.py).
        self.calls = CallPatterns(self.mode, self)
        self._current = stream
        self._lazy = lazy
        self.active = False

    def activate(self) -> None:
        if not self.active:
            # Below any dispatch mode already in force (a user's, entered before the first sign
            # of asynchrony): pushed above it, its own exit would pop this mode in its place.
            _enter_below_all(self.mode)
            keep_modes_reachable()
            self.active = True
            self._listeners().append(self.mode.adopted)

    def _listeners(self) -> list:
        return getattr(self.mode.memory, "adoption_listeners", [])

    def __enter__(self) -> "AsyncWork":
        if not self._lazy:
            self.activate()
        return self

    def __exit__(self, *exc) -> None:
        try:
            with _outside_modes():
                self.schedule.synchronize_device()
        finally:
            if self.active:
                _remove_dispatch_mode(self.mode)
                self.active = False
                listeners = self._listeners()
                if self.mode.adopted in listeners:
                    listeners.remove(self.mode.adopted)
        if exc[0] is None:
            self.mode.raise_late()

    # --- the host waits ----------------------------------------------------------------------

    def synchronize_stream(self, stream: int) -> None:
        self.mode.check_drops()
        with _outside_modes():
            self.schedule.run_stream(stream)
        self.tracker.synchronize_stream(stream)

    def synchronize_event(self, event: int) -> None:
        self.mode.check_drops()
        with _outside_modes():
            self.schedule.synchronize_event(event)
        self.tracker.synchronize_event(event)

    def synchronize_device(self) -> None:
        self.mode.check_drops()
        with _outside_modes():
            self.schedule.synchronize_device()
        self.tracker.synchronize_device()

    def run_ahead_of_the_host(self, stream: int) -> None:
        """Run `stream`'s queued work now, without the host waiting for it: the host is about to
        change memory in a way CUDA orders after that work (a storage's resize copies on it)."""
        with _outside_modes():
            self.schedule.run_stream(stream)

    def host_reads(self, tensor: torch.Tensor, op: str, where: str = "") -> None:
        """A host read that skips the dispatcher (`tolist`, `numpy`, printing) of a pinned buffer."""
        key = storage_key(tensor)
        self.tracker.labels.setdefault(key, label_of(tensor))
        self.tracker.host_read(key, op=op, where=where)

    # --- streams and events ------------------------------------------------------------------

    def record_event(self, event: int, stream: int) -> None:
        self.tracker.record_event(event, stream)
        self.schedule.record_event(event, stream)

    def wait_event(self, stream: int, event: int) -> None:
        self.mode.check_drops()
        self.tracker.wait_event(stream, event)
        self.schedule.wait_event(stream, event)

    def wait_stream(self, stream: int, other: int) -> None:
        self.mode.check_drops()
        self.tracker.wait_stream(stream, other)
        self.schedule.wait_stream(stream, other)

    def event_done(self, event: int) -> bool:
        return self.schedule.event_done(event)

    def stream_done(self, stream: int) -> bool:
        return not self.schedule.pending(stream)

    def poll_event(self, event: int) -> bool:
        """`Event.query()`: False while the work before `event` is queued (which then runs, see
        Schedule.poll_event); True orders the host after that work, as CUDA's cudaSuccess does."""
        with _outside_modes():
            done = self.schedule.poll_event(event)
        if done:
            self.synchronize_event(event)
        return done

    def poll_stream(self, stream: int) -> bool:
        """`Stream.query()`, as `poll_event` for everything issued to `stream`."""
        with _outside_modes():
            done = self.schedule.poll_stream(stream)
        if done:
            self.synchronize_stream(stream)
        return done

    def sleep(self, stream: int, where: str = "", cycles: int = 0) -> None:
        """`torch.cuda._sleep(cycles)`: the stream's later work waits until something waits for
        it (or polls outlast the cycles: schedule.polls_of)."""
        self.schedule.stall(stream, self.tracker.launch(stream, op="torch.cuda._sleep", where=where),
                            cycles)

    def record_stream(self, tensor: torch.Tensor, stream: int) -> None:
        self.tracker.record_stream(storage_key(tensor), stream)

    # --- graphs ------------------------------------------------------------------------------

    def replay(self, stream: int, reads: Iterable[int], writes: Iterable[int],
               run: Callable[[], None], *, name: str = "a graph", where: object = "",
               hold: Callable[[], list] | None = None,
               steps: Callable[[], list] | None = None,
               segments: list[tuple[Iterable[int], Iterable[int], int | None]] = ()) -> None:
        """A graph replay issued to `stream`: one op over every storage its recording touches.
        A replay that waits in its stream's queue keeps what `hold()` returns alive until it
        runs (the memory it uses but does not own: it writes through raw pointers), counted in
        `mode.holds`, which tells a later launch that the caller dropped that memory; given `steps()` (its recorded calls one by one), the queued replay
        runs step by step, interleaved with other streams' queued work.

        A graph with event nodes comes as `segments` (reads, writes, the event id recorded after
        them): the tracker sees one op per segment with each event recorded between, so a
        stream waiting on the event is ordered after the work before the node only. The schedule
        still runs the replay as one item, and a wait on the event runs all of it."""
        op = f"replay of {name}"
        if segments:
            for part_reads, part_writes, event in segments:
                seq = self.tracker.launch(stream, part_reads, part_writes, op=op, where=where)
                if event is not None:
                    self.tracker.record_event(event, stream)
        else:
            seq = self.tracker.launch(stream, reads, writes, op=op, where=where)
        with _outside_modes():
            if self.schedule.defers(stream):
                release = self.mode.holds.hold_for_replay(hold() if hold is not None else [])
                if steps is not None:
                    self.schedule.queue(stream, seq, Stepped(steps, release))
                else:
                    def run_holding() -> None:
                        run()
                        release()

                    self.schedule.queue(stream, seq, run_holding)
            else:
                run()
                self.schedule.ran(stream, seq)
        for *_, event in segments:
            if event is not None:
                self.schedule.record_event(event, stream)
