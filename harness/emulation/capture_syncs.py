"""Host synchronizations during a capture, refused as CUDA refuses them.

CUDA's rules (the programming guide's "prohibited and unhandled operations" and
cudaStreamCaptureMode):

- Synchronizing or querying a stream that takes part in a capture, or an event recorded inside
  one, conflicts with the capture itself: refused in every capture_error_mode, from any thread
  (for the event with cudaErrorCapturedEvent's text, as the H200 gives it).
- Synchronizing the device (`torch.cuda.synchronize()`) while a capture is under way synchronizes
  "a broader handle which encompasses an active stream capture": refused in every mode too.
- Any other synchronization or query (a stream or an event outside the capture) is a "potentially
  unsafe" call: refused in "global" mode from every thread of the process, in "thread_local" mode
  from the thread that began the capture only, never in "relaxed" mode.

A refused call raises cudaErrorStreamCaptureUnsupported's text and invalidates the capture, so
`capture_end()` then fails even when the caller caught the first error (EmulatedCUDAGraph).
A graph replayed into a capturing stream is torch's refusal instead (`refuse_graph_launch`):
nothing reaches CUDA, and the capture goes on.

The device a check asks (`host`: the emulated device's state or the graph sanitizer's host) has
`capture` (the graph being captured, or None) and `stream_captures(stream)`.
"""

from __future__ import annotations

import threading
from typing import Any

from harness.graphs.base import CaptureError, CaptureInvalidatedError
from harness.graphs.emulator import cuda_errors
from harness.emulation.unsafe_calls import refuses_unsafe_call
from harness.graphs.emulator.callsite import at_callsite, current_callsite

NOT_PERMITTED = "CUDA error: operation not permitted when stream is capturing"
# What CUDA says instead for an event recorded inside the capture (measured on an H200, torch 2.11).
CAPTURED_EVENT = "CUDA error: operation not permitted on an event last recorded in a capturing stream"


def refuse_host_sync(host: Any, what: str, *, stream: Any = None, event: Any = None,
                     device: bool = False) -> None:
    """Raise CUDA's error for `what` (the call, as the user wrote it) when the capture under way
    forbids it; the target is the device (`device`), a stream or an event."""
    graph = host.capture
    if graph is None:
        return
    mode = graph.capture_error_mode
    captured_event = event is not None and graph.recorded_event(event)
    conflicts = device or (stream is not None and host.stream_captures(stream)) or captured_event
    own_thread = threading.get_ident() == graph.capture_thread
    if not conflicts and not refuses_unsafe_call(graph, own_thread):
        return
    if conflicts:
        why = ("it waits for work that is being captured, not run" if not device else
               "the device includes the capturing stream, whose work is captured, not run")
    else:
        why = (f"a potentially unsafe call while a capture_error_mode={mode!r} capture is under "
               f"way{'' if own_thread else ' in another thread'}")
    # A call that waits for the capture itself is refused in every mode: no mode is a remedy.
    remedy = ("synchronize before capture_begin() or after capture_end()" if own_thread else
              "keep other threads from waiting for the device or the capture's streams while "
              "the capture runs" if conflicts else
              "keep other threads from synchronizing while the capture runs, or capture with "
              "capture_error_mode='thread_local'")
    text = (f"{CAPTURED_EVENT} (cudaErrorCapturedEvent)" if captured_event and not device else
            f"{NOT_PERMITTED} (cudaErrorStreamCaptureUnsupported)")
    error = CaptureError(at_callsite(
        f"{text}: {what} during a CUDA graph "
        f"capture: {why}. The capture is invalidated; {remedy}", current_callsite()), op=what)
    graph.invalidate(error)
    raise error


def read_outside_capture(host: Any, what: str) -> bool:
    """Whether a host read of device data (`what`, the call) by this thread on its current stream
    is outside the capture under way: another thread's on a stream the capture does not take in,
    or the capturing thread's on a side stream. Copy.cu's capture check asks only the current
    stream, so such a read copies and then waits for its own stream, a potentially unsafe call:
    raises CUDA's refusal (`refuse_host_sync`) where the capture's mode refuses it. False for a
    read on a capturing stream: the capture refuses that one itself, in CUDA's words."""
    if host.capture is None:
        return True
    stream = host.current_stream()
    if host.stream_captures(stream):
        return False
    refuse_host_sync(host, what, stream=stream)
    return True


REPLAY_WHILE_CAPTURING = (
    "Cannot prepare for replay during capturing stage. during CUDA graph capture. If you need "
    "this call to be captured, please file an issue. Current cudaStreamCaptureStatus: "
    "cudaStreamCaptureStatusActive")


def refuse_graph_launch(host: Any, what: str) -> None:
    """Raise torch's error for replaying a graph (`what`, the call) on a stream that takes part in
    the capture under way: CUDAGraph::replay checks the current stream before it launches, in
    every capture mode, so nothing reaches CUDA and the capture goes on (H100, torch 2.11: the
    outer capture_end succeeds, without the inner graph's work). A replay on any other stream is
    asynchronous work, allowed."""
    if host.capture is None or not host.stream_captures(host.current_stream()):
        return
    raise CaptureError(at_callsite(
        f"{REPLAY_WHILE_CAPTURING}: {what} on a stream that is capturing. A graph launch is not "
        f"captured into another graph; replay before capture_begin() or after capture_end(), or "
        f"run the graphed callable's own ops (not its graph) inside the capture",
        current_callsite()), op=what)


def invalidated_capture_error(cause: CaptureError) -> CaptureInvalidatedError:
    """What `capture_end()` raises after a refused call invalidated its capture."""
    return CaptureInvalidatedError(
        f"{cuda_errors.INVALIDATED} (cudaErrorStreamCaptureInvalidated): capture_end() of a "
        f"capture invalidated by an earlier refused call: {cause}", op="capture_end")
