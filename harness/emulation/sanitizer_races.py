"""Races between the branches of one graph sanitizer capture, judged while it is captured.

The sanitizer's replay runs every recorded op on the replay's stream, one after another, so two
branches of the capture (a stream forked into it, running beside the capturing stream until a
join) never race there; and the real streams' tracking (tracking/real_streams.py) passes captured
ops by, as work that runs only at replay. On CUDA those branches are parallel nodes of the graph:
a block freed on the capturing stream while a forked stream still reads it is handed to the
capturing stream's next allocation in the same capture, and every replay races. So, as the
emulated device does (tracking/capture_races.py), each captured op of the capturing thread is
checked against the capture's own clocks (its forks and joins), by a tracker of its own that
reports where the real streams' tracking in force reports. Without that tracking in force
(`track_stream_races()` entered before the capture) nothing is judged, as outside a capture.
"""

from __future__ import annotations

from typing import Any

from harness.emulation.tracking.capture_races import CaptureRaces
from harness.emulation.tracking.real_streams import RealStreamWork, tracking_in_force


class SanitizerCaptureRaces:
    """One capture's branch races; streams are named by the real tracking's ids (its reports')."""

    def __init__(self, work: RealStreamWork, memory: Any) -> None:
        self._ids = work.ids
        self._races = CaptureRaces(work.tracker, memory)

    def op(self, stream: Any, func, args: tuple, kwargs: dict, out: Any) -> None:
        """The op that just ran on captured `stream` (raises RaceError in strict mode)."""
        self._races.op(self._ids.of(stream), func, args, kwargs, out)

    def record_event(self, event: Any, stream: Any) -> None:
        self._races.clocks.record_event(id(event), self._ids.of(stream))

    def wait_event(self, stream: Any, event: Any) -> None:
        self._races.clocks.wait_event(self._ids.of(stream), id(event))


def capture_races(memory: Any) -> SanitizerCaptureRaces | None:
    """For a capture beginning now: None where no real streams' tracking is in force."""
    work = tracking_in_force()
    return None if work is None else SanitizerCaptureRaces(work, memory)
