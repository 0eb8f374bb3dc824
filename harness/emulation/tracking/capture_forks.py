"""The streams forked into one capture, and whether each was joined back before the capture ends.

CUDA ends a capture with cudaErrorStreamCaptureUnjoined ("capturing stream has unjoined work")
when a stream forked into it (one that waited on the capturing stream's work) has captured work
the capturing stream never waited for. Whoever sees a capture's ops and its forks and joins (the
emulated device's capture rules, tracking/capture_streams.py; the graph sanitizer's stream
rules, sanitizer_threads.py) tells this object: each op on a stream of the capture as a launch
on `clocks` (`ran`), each record and wait as an edge of `clocks`; `unjoined_error()` is what
ending the capture raises.
"""

from __future__ import annotations

from typing import Any, Callable

from harness.graphs.base import CaptureError
from harness.graphs.emulator import cuda_errors
from harness.graphs.emulator.callsite import at_callsite, current_callsite
from harness.emulation.tracking.clocks import Clocks


class CaptureForks:
    """`origin` is the capturing stream, `key(stream)` a stream's participant id in `clocks`
    (the queue it names: a wrapper of the capturing stream's handle is the capturing stream)."""

    def __init__(self, origin: Any, key: Callable[[Any], Any], clocks: Clocks) -> None:
        self.origin = origin
        self.key = key
        self.clocks = clocks
        self._origin_key = key(origin)
        # a fork's key -> (its last op's sequence number, where it was issued, the stream)
        self._last: dict[Any, tuple[int, str, Any]] = {}

    def launch(self, stream: Any) -> int:
        """A captured op is issued on `stream` now: its sequence number on `clocks`."""
        return self.clocks.launch(self.key(stream))

    def ran(self, stream: Any, seq: int) -> None:
        """Op `seq` of `clocks` ran in the capture on `stream`."""
        key = self.key(stream)
        if key != self._origin_key:
            self._last[key] = (seq, current_callsite(), stream)

    def unjoined_error(self) -> CaptureError | None:
        """What ending the capture raises: a fork not joined back to the capturing stream."""
        for key, (seq, where, stream) in self._last.items():
            if not self.clocks.ordered(self._origin_key, key, seq):
                return CaptureError(cuda_errors.cuda_first(cuda_errors.UNJOINED, at_callsite(
                    f"capture_end() with work on stream {stream.stream_id} not joined back to the "
                    f"capturing stream {self.origin.stream_id} (cudaErrorStreamCaptureUnjoined). "
                    f"Make the capturing stream wait for it before the capture ends "
                    f"(torch.cuda.current_stream().wait_stream(side), or wait_event on an event "
                    f"recorded on the side stream after its last op)", where)), op="capture_end")
        return None
