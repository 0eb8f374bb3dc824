"""Threads started inside the emulation run on the emulated device too.

torch keeps its function-mode and dispatch-mode stacks per thread, so a thread started inside
`emulate_cuda()` would see none of the device's modes: its "cuda" tensors would be plain cpu
tensors and its work untracked. While the emulation is active, `threading.Thread.start` gives
each new thread (threading.Thread, its subclasses, concurrent.futures' workers) the placement mode
and, once stream tracking has started, the tracking mode, for the thread's whole run, and the
starter's event-timing clock (device_clock.py; `Thread.join` hands a finished thread's clock on).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

from harness.torch_internals import get_current_function_mode_stack as _get_current_function_mode_stack

from harness.emulation.tracking.races import RaceError
from harness.graphs.emulator.dispatch_keys import keep_modes_reachable


@contextlib.contextmanager
def device_modes(state: Any) -> Iterator[None]:
    """The emulated device's modes on this thread, as on the thread that entered it."""
    with contextlib.ExitStack() as stack:
        if state.placement is not None and state.placement not in _get_current_function_mode_stack():
            stack.enter_context(state.placement)
        tracking = state.streams_tracking
        if tracking is not None and tracking.work.active:
            stack.enter_context(tracking.work.mode)
            keep_modes_reachable()
        yield


def _hand_over(state: Any, race: RaceError) -> None:
    """A race met on this thread also fails the emulation's own thread, at its next device op or
    at the tracked region's end: an exception ending a thread reaches only `threading.excepthook`,
    and a test would pass while its staging buffer raced."""
    tracking = state.streams_tracking
    if tracking is not None:
        tracking.work.mode.raise_later(race)


def thread_start_patch(state: Any, active: Any) -> list[tuple[Any, str, Any]]:
    """The replacements of `threading.Thread.start` and `join`; `active()` says whether `state`
    is still the emulation in force when the thread runs (a thread may outlive the emulation).
    A thread's event-timing clock starts from its starter's, and a join of a finished thread
    moves the joiner's on to the joined thread's (device_clock.py)."""
    start, join = threading.Thread.start, threading.Thread.join
    clock = state.streams.clock

    def start_on_the_device(self: threading.Thread) -> None:
        run = self.run  # bound here: a subclass's own run() included
        lag = clock.thread_lag()

        def run_on_the_device() -> None:
            if not active():
                run()
                return
            clock.begin_thread(lag)
            with device_modes(state):
                try:
                    run()
                except RaceError as race:
                    _hand_over(state, race)
                    raise
                finally:
                    clock.end_thread(self)

        self.run = run_on_the_device
        start(self)

    def join_on_the_clock(self: threading.Thread, timeout: float | None = None) -> None:
        join(self, timeout)
        if active() and not self.is_alive():
            clock.joined(self)

    return [(threading.Thread, "start", start_on_the_device),
            (threading.Thread, "join", join_on_the_clock)]
