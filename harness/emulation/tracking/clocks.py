"""Happens-before between streams and the host, as vector clocks.

Every device op on a stream gets the next sequence number; a participant's clock maps each stream
to the last sequence number of that stream it is known to come after. Events carry a copy of their
stream's clock when recorded; waiting joins clocks (the stream's for `wait_event`/`wait_stream`,
the host's for `synchronize`, `Event.synchronize`, blocking copies and `.item()`). Work is issued by
the host, so a launch joins the host's clock first: anything the host had waited for is ordered
before everything it issues afterwards. This is the rule of PyTorch's CUDA stream sanitizer with
the host as one more participant.
"""

from __future__ import annotations

HOST = -1  # the host's participant id; stream ids are the caller's (any other int)


def _join(into: dict[int, int], other: dict[int, int]) -> None:
    for stream, seq in other.items():
        if into.get(stream, 0) < seq:
            into[stream] = seq


class Clocks:
    def __init__(self) -> None:
        self._seq = 0
        self._streams: dict[int, dict[int, int]] = {}
        self._events: dict[int, dict[int, int]] = {}
        self.host: dict[int, int] = {}
        # Bumped whenever the host's clock grows; a stream that joined it at this version has
        # nothing to join at its next launch (most launches: the host waits once per step).
        self._host_version = 0
        self._joined: dict[int, int] = {}  # stream -> the host version its clock last joined

    def _stream(self, stream: int) -> dict[int, int]:
        if stream == HOST:
            raise ValueError(f"stream id {HOST} is the host's; give streams any other int")
        clock = self._streams.get(stream)
        if clock is None:
            clock = self._streams[stream] = dict(self.host)
        return clock

    def launch(self, stream: int) -> int:
        """The sequence number of a new op on `stream`, ordered after all the host waited for."""
        clock = self._streams.get(stream)
        if clock is None:
            clock = self._stream(stream)
        if self._joined.get(stream) != self._host_version:
            _join(clock, self.host)
            self._joined[stream] = self._host_version
        self._seq += 1
        clock[stream] = self._seq
        return self._seq

    def last(self, stream: int) -> int:
        """The sequence number of the last op launched on `stream` (0: none yet)."""
        return self._streams.get(stream, {}).get(stream, 0)

    def ordered(self, participant: int, stream: int, seq: int) -> bool:
        """Whether `participant` (a stream, or HOST) is known to come after op `seq` of `stream`."""
        if participant == stream:
            return True
        clock = self.host if participant == HOST else self._stream(participant)
        if clock.get(stream, 0) >= seq:
            return True
        # A stream also comes after whatever the host had waited for when it launched last; a
        # stream that has not launched since the host waited inherits it at its next launch.
        return participant != HOST and self.host.get(stream, 0) >= seq

    def record_event(self, event: int, stream: int) -> None:
        self._events[event] = dict(self._stream(stream))

    def wait_event(self, stream: int, event: int) -> None:
        """`stream.wait_event(event)`; an event never recorded is complete, as in CUDA."""
        _join(self._stream(stream), self._events.get(event, {}))

    def wait_stream(self, stream: int, other: int) -> None:
        _join(self._stream(stream), self._stream(other))

    def synchronize_event(self, event: int) -> None:
        self._host_waits(self._events.get(event, {}))

    def synchronize_stream(self, stream: int) -> None:
        self._host_waits(self._stream(stream))

    def synchronize_device(self) -> None:
        for clock in list(self._streams.values()):
            self._host_waits(clock)

    def _host_waits(self, clock: dict[int, int]) -> None:
        _join(self.host, clock)
        self._host_version += 1

    def forget_event(self, event: int) -> None:
        self._events.pop(event, None)

    def stream_done(self, stream: int) -> bool:
        """Whether the host has waited for every op issued to `stream` so far."""
        clock = self._streams.get(stream)
        return clock is None or self.host.get(stream, 0) >= clock.get(stream, 0)
