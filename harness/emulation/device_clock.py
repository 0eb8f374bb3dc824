"""The time `torch.cuda.Event` timing reads on the emulated device: the host's clock, plus the time
the device's streams would still be busy with `torch.cuda._sleep`.

Device work runs on the cpu when it is issued, so an event's time is the host's clock when it is
recorded, except behind a sleep: `torch.cuda._sleep(cycles)` keeps its stream busy for
cycles / the SM clock (CUDA's spin kernel), and an event recorded after it is timestamped when that
time is over. Waits carry a stream's busy time to the waiting stream, as a GPU orders the work.
The host waiting for a busy stream (`Stream.synchronize()`, `Event.synchronize()`,
`torch.cuda.synchronize()`, a query that answers True) moves the host's clock on to when the
work ends, without sleeping: the clock is `time.perf_counter()` plus the time every such wait
would have taken, one timeline for all host threads, as wall time is. So two devices (or two
streams) sleeping at once overlap: a host thread that waits for one finds the other done as much
later as it ran at the same time, the overlap PyTorch's `test_stream_event_nogil` measures.
"""

from __future__ import annotations

import threading
import time

SM_CLOCK_HZ = 1_980_000_000  # what get_device_properties().clock_rate reports (kHz there)


class DeviceClock:
    """Each stream's busy-until time and the host's clock (see the module docstring). Streams are
    keyed by what `key(stream)` gives (id and device); times are seconds on the host's timeline."""

    def __init__(self, hz: float) -> None:
        if hz <= 0:
            raise ValueError(f"a clock rate of {hz} Hz: the device's SM clock must be positive")
        self._hz = hz
        self._lag = 0.0  # the time the host's waits for busy streams would have taken
        self._busy: dict[tuple[int, int], float] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(stream) -> tuple[int, int]:
        device, queue = stream.queue  # a wrapper of a stream's handle: that stream's clock
        return (queue, device)

    def now(self) -> float:
        return time.perf_counter() + self._lag

    def sleep(self, stream, cycles: int) -> None:
        """`torch.cuda._sleep(cycles)` on `stream`: busy for that long after its earlier work."""
        key = self.key(stream)
        with self._lock:
            self._busy[key] = max(self.now(), self._busy.get(key, 0.0)) + max(0, cycles) / self._hz

    def record(self, stream) -> float:
        """An event's timestamp when recorded on `stream`: when the stream's work before it ends."""
        return max(self.now(), self._busy.get(self.key(stream), 0.0))

    def wait_until(self, stream, when: float) -> None:
        """`stream`'s later work waits for work that ends at `when` (an event, another stream)."""
        key = self.key(stream)
        with self._lock:
            if when > self._busy.get(key, 0.0):
                self._busy[key] = when

    def busy_until(self, stream) -> float:
        return self._busy.get(self.key(stream), 0.0)

    def host_waits(self, until: float) -> None:
        """The host waited for work that ends at `until`: its clock moves on to then."""
        with self._lock:
            late = until - self.now()
            if late > 0:
                self._lag += late

    def host_waits_for_stream(self, stream) -> None:
        """`Stream.synchronize()`, or a query that found the stream's work done."""
        self.host_waits(self.busy_until(stream))

    def host_waits_for_device(self, device: int | None = None) -> None:
        """`torch.cuda.synchronize(device)` (every device for None)."""
        ends = [t for (_, index), t in list(self._busy.items()) if device is None or index == device]
        if ends:
            self.host_waits(max(ends))


__all__ = ["DeviceClock"]
