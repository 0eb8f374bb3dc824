"""Work another thread issues on a capturing stream goes into the capture, as on CUDA.

CUDA's capture belongs to the stream: a kernel that any thread launches into a stream taking part
in the capture (the capturing stream, or a stream forked into it) is captured, not run, and runs
at each replay. torch keeps dispatch modes per thread, so the modes a capture pushes (the
recorder, the capture's stream rules) sit on the stack of the thread that began it only: another
thread's op went past them, ran at once and was left out of the graph. Every thread of the
emulation has the placement mode (threads.py), which asks `capture_modes_for_this_thread` before
a call: for another thread whose current stream takes part in the capture, the call runs with
the capture's modes pushed on this thread's stack (`joined`), so the recorder records it and the
capture's race checks see it in its stream's order. Work of that thread on any other stream is
not routed and runs at once, as on CUDA (the legacy default stream included: measured on an
H100, torch 2.11, 2026-12-06, in every capture_error_mode).

The device asked (`state`: the emulated device's state or the graph sanitizer's host) has
`capture`, `current_stream()` and `stream_captures(stream)`.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

from harness.torch_internals import pop_mode, push_mode
from harness.graphs.emulator.dispatch_keys import keep_modes_reachable

# Set on a thread while one of its calls runs under a capture's modes: the calls it makes below
# (a composite's parts) are under them already.
_joined = threading.local()


def capture_modes_for_this_thread(state: Any) -> tuple:
    """The dispatch modes of the capture under way that this thread's next call must pass
    through, bottom first; () when the call is not another thread's work on a capturing stream."""
    graph = state.capture
    if graph is None or getattr(_joined, "on", False):
        return ()
    if threading.get_ident() == getattr(graph, "capture_thread", None):
        return ()
    if not state.stream_captures(state.current_stream()):
        return ()
    return getattr(graph, "thread_modes", ())


@contextlib.contextmanager
def joined(modes: tuple) -> Iterator[None]:
    """`modes` (from `capture_modes_for_this_thread`) pushed on this thread's dispatch stack."""
    _joined.on = True
    pushed = 0
    try:
        for mode in modes:
            push_mode(mode)
            pushed += 1
        keep_modes_reachable()
        yield
    finally:
        for _ in range(pushed):
            pop_mode()
        _joined.on = False
