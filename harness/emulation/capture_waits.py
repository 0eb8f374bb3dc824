"""A capturing stream made to wait on work outside its capture, refused as CUDA refuses it.

CUDA's programming guide ("Cross-stream dependencies and events"): a capture may wait on an event
only when the event was recorded into the same capture; waiting on one recorded outside it (before
the capture began, or during it on a stream that never joined it) would make the graph depend on
work that is not in it. cudaStreamWaitEvent returns cudaErrorStreamCaptureIsolation in every
capture_error_mode ("relaxed" included: field reports from vLLM- and SGLang-style prefetch streams)
and the capture is invalidated. `wait_stream(other)` is `wait_event(other.record_event())`, so it
is refused when `other` is not in the capture. Allowed, as on CUDA: waiting on an event never
recorded (a no-op), on an event recorded inside the capture (a join), and on an event made with
`external=True` (cudaEventWaitExternal: an external-event node of the graph). A stream outside the
capture may wait on anything: waiting on a captured event is how it joins (a fork).

The device a check asks (`host`) has `capture` and `stream_captures(stream)`, as in
capture_syncs.py.
"""

from __future__ import annotations

from typing import Any

from harness.graphs.base import CaptureDependencyError
from harness.graphs.emulator.callsite import at_callsite, current_callsite

ISOLATION = "CUDA error: dependency created on uncaptured work in another stream"


def refuse_uncaptured_wait(host: Any, waiting: Any, *, event: Any = None, other: Any = None,
                           what: str) -> None:
    """Raise CUDA's error when capturing stream `waiting` is made to wait on `event`, or on
    stream `other` (`wait_stream`), and that work is outside the capture under way."""
    graph = host.capture
    if graph is None or not host.stream_captures(waiting):
        return
    if event is not None:
        if (getattr(event, "recorded_on", None) is None or getattr(event, "external", False)
                or graph.recorded_event(event)):
            return
        why = ("the event was last recorded outside this capture (before it began, or on a stream "
               "that never joined it)")
    else:
        if other == waiting or host.stream_captures(other):
            return
        why = (f"{other} is not part of the capture (it never waited on the capturing stream), "
               f"so the event wait_stream records on it is uncaptured work")
    remedy = ("fork the other stream from the capturing one inside the capture "
              "(other.wait_stream(torch.cuda.current_stream())) before its work and the join, or "
              "wait on it before capture begins")
    error = CaptureDependencyError(at_callsite(
        f"{ISOLATION} (cudaErrorStreamCaptureIsolation): {what} during a CUDA graph capture: "
        f"{why}. The capture is invalidated; {remedy}", current_callsite()), op=what)
    graph.invalidate(error)
    raise error
