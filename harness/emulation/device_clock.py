"""The time `torch.cuda.Event` timing reads on the emulated device: the host's clock, plus the time
the device's streams would still be busy with `torch.cuda._sleep`.

Device work runs on the cpu when it is issued, so an event's time is the host's clock when it is
recorded, except behind a sleep: `torch.cuda._sleep(cycles)` keeps its stream busy for
cycles / the SM clock (CUDA's spin kernel), and an event recorded after it is timestamped when that
time is over. Waits carry a stream's busy time to the waiting stream, as a GPU orders the work.
The host waiting for a busy stream (`Stream.synchronize()`, `Event.synchronize()`,
`torch.cuda.synchronize()`, a query that answers True) moves the host's clock on to when the
work ends, without sleeping: the clock is `time.perf_counter()` plus the time every such wait
would have taken.

That time is kept per host thread. On a GPU a thread blocked in a synchronize releases the GIL and
another thread issues its own work meanwhile; here the synchronize returns at once and the other
thread runs later in wall time, so with one clock for all threads its work would start after the
first thread's wait, and two devices' sleeps issued by two threads would run back to back instead
of at once (PyTorch's `test_stream_event_nogil` measures that overlap). A thread's clock moves on
only for its own waits: a thread started inside the emulation starts from its starter's clock
(threads.py), and `Thread.join()` of a finished thread moves the joiner's clock on to the joined
thread's last. Other hand-offs between threads (a queue, a lock, a future's result) are not seen:
a thread that learns through one of them that another thread's wait ended keeps its own clock, so
an event it records then may be earlier than on a GPU. A thread the emulation did not start (one
made before it) starts from the latest clock of any thread.
"""

from __future__ import annotations

import threading
import time
import weakref

SM_CLOCK_HZ = 1_980_000_000  # what get_device_properties().clock_rate reports (kHz there)


class DeviceClock:
    """Each stream's busy-until time and the host's clock (see the module docstring). Streams are
    keyed by what `key(stream)` gives (id and device); times are seconds on the host's timeline."""

    def __init__(self, hz: float) -> None:
        if hz <= 0:
            raise ValueError(f"a clock rate of {hz} Hz: the device's SM clock must be positive")
        self._hz = hz
        # per host thread: the time its waits for busy streams would have taken
        self._thread = threading.local()
        self._latest_lag = 0.0  # the largest of any thread's: where an unknown thread starts
        self._ended: weakref.WeakKeyDictionary[threading.Thread, float] = \
            weakref.WeakKeyDictionary()
        self._busy: dict[tuple[int, int], float] = {}
        self._lock = threading.Lock()

    def _lag(self) -> float:
        lag = getattr(self._thread, "lag", None)
        if lag is None:
            lag = self._thread.lag = self._latest_lag
        return lag

    def _set_lag(self, lag: float) -> None:
        self._thread.lag = lag
        with self._lock:
            self._latest_lag = max(self._latest_lag, lag)

    def thread_lag(self) -> float:
        """This thread's lag, which a thread it starts begins with (`begin_thread`)."""
        return self._lag()

    def begin_thread(self, lag: float) -> None:
        """This thread was started by one whose clock was `lag` ahead of the wall clock."""
        self._thread.lag = lag

    def end_thread(self, thread: threading.Thread) -> None:
        """`thread` (this one) ends: a thread that joins it goes on from its clock."""
        with self._lock:
            self._ended[thread] = self._lag()

    def joined(self, thread: threading.Thread) -> None:
        """This thread's `thread.join()` returned with `thread` finished."""
        with self._lock:
            lag = self._ended.get(thread)
        if lag is not None and lag > self._lag():
            self._set_lag(lag)

    @staticmethod
    def key(stream) -> tuple[int, int]:
        device, queue = stream.queue  # a wrapper of a stream's handle: that stream's clock
        return (queue, device)

    def now(self) -> float:
        """This host thread's clock."""
        return time.perf_counter() + self._lag()

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
        """This host thread waited for work that ends at `until`: its clock moves on to then."""
        late = until - self.now()
        if late > 0:
            self._set_lag(self._lag() + late)

    def host_waits_for_stream(self, stream) -> None:
        """`Stream.synchronize()`, or a query that found the stream's work done."""
        self.host_waits(self.busy_until(stream))

    def host_waits_for_device(self, device: int | None = None) -> None:
        """`torch.cuda.synchronize(device)` (every device for None)."""
        ends = [t for (_, index), t in list(self._busy.items()) if device is None or index == device]
        if ends:
            self.host_waits(max(ends))


__all__ = ["DeviceClock"]
