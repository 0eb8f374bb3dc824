"""When device work runs. In issue order, an op runs when the host issues it; in the adversarial
schedule each stream's work waits in a queue until something synchronizes with it: the host
(`synchronize`, `Event.synchronize`, a blocking copy, `.item()`) or another stream's wait, which
runs the waited-for work first. So work runs as late as the synchronization rules allow, and a
missing wait shows the wrong values a loaded GPU shows, every time. One exception, for the race
that lateness hides: a write that races with an access another stream still has queued (the
stream mode asks `queued`) runs at once, ahead of that access (a writer ahead of an earlier reader,
as a GPU runs it while the reader's stream is busy).

`torch.cuda._sleep` holds its stream back in issue order too: the stream's later work queues
until the host or another stream waits for it, as a stalled GPU stream would. A query that finds
the stall in the way answers False for as many polls as the sleep's cycles last (`polls_of`), and
only then as for other queued work (False once, then the work runs): a host polling three times in
a row sees a 50M-cycle sleep still busy, as a GPU spinning for tens of milliseconds is, and a
polling loop still ends.

A queued graph replay runs one recorded call at a time (`Stepped`), and while one is under way the
schedule alternates between the streams that are ready: two replays on streams that never waited
for each other run interleaved, as their kernels do on a GPU, so graphs sharing a pool corrupt
each other's intermediates exactly when CUDA lets them.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable

SCHEDULES = ("issue_order", "adversarial")


@dataclass(frozen=True)
class _After:
    """A queued wait: before running further, the stream runs `stream`'s work up to `seq`."""

    stream: int
    seq: float


# How many of a sleep's cycles one query counts for. Measured on an H100 (torch 2.11): a
# 50M-cycle sleep outlasted about 44,000 Stream.query() calls from Python (0.57 us each, about
# 1,100 cycles at 1.98 GHz). The emulated query costs about 20 us, so a count of 10,000 cycles
# keeps a polling loop's wall time near the GPU's (5,000 polls, about 0.1 s) while three polls
# in a row still find any sleep of 30,000 cycles or more busy. The GPU's own clock is not
# modelled (no wall time), only the order of polls and work.
CYCLES_PER_POLL = 10_000


def polls_of(cycles: int) -> int:
    """How many queries a `torch.cuda._sleep(cycles)` still running answers False to, before
    the work behind it counts as queued work (0 for a sleep shorter than one poll)."""
    return max(0, int(cycles)) // CYCLES_PER_POLL


@dataclass(frozen=True)
class _Stall:
    """`torch.cuda._sleep` on the stream: nothing to run, but the work behind it queues. It ends
    once the schedule's poll count reaches `ends_at` (see `polls_of`)."""

    ends_at: int


class Stepped:
    """Queued work that runs in steps: `steps()` (called when the first step is due) gives the
    calls, `done()` runs after the last."""

    def __init__(self, steps: Callable[[], list], done: Callable[[], None]) -> None:
        self._make = steps
        self._done = done
        self._left: deque | None = None

    def step(self) -> bool:
        """Run the next step; True while more are left."""
        if self._left is None:
            self._left = deque(self._make())
        if self._left:
            self._left.popleft()()
        if self._left:
            return True
        self._done()
        return False


class Schedule:
    def __init__(self, schedule: str = "issue_order") -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule={schedule!r}; accepted: {', '.join(SCHEDULES)}")
        self.name = schedule
        self.adversarial = schedule == "adversarial"
        self._queues: dict[int, deque] = {}
        self._issued: dict[int, float] = {}  # stream -> seq of its last issued item
        self._ran: dict[int, float] = {}  # stream -> seq of its last item run
        self._events: dict[int, tuple[int, float]] = {}
        self._answered_busy: set[tuple[str, int, float]] = set()  # queries answered False
        # Queries that found a stall still running: the schedule's measure of the GPU's time
        # (each such poll is CYCLES_PER_POLL cycles of every stall, on every stream).
        self._polls = 0
        self.deferred = 0  # ops that waited in a queue, for statistics

    def _queue(self, stream: int) -> deque:
        queue = self._queues.get(stream)
        if queue is None:
            queue = self._queues[stream] = deque()
        return queue

    def pending(self, stream: int) -> bool:
        return bool(self._queues.get(stream))

    def queued(self, stream: int, seq: float) -> bool:
        """Whether item `seq` of `stream` waits in its queue (issued, not run)."""
        return self._ran.get(stream, 0) < seq and self.pending(stream)

    def defers(self, stream: int) -> bool:
        """Whether work issued to `stream` now waits in its queue."""
        return self.adversarial or bool(self._queues.get(stream))

    def issue(self, stream: int, seq: int, run: Callable[[], None]) -> bool:
        """Run `run` now or queue it on `stream`; True when it was queued."""
        if self.defers(stream):
            self.queue(stream, seq, run)
            return True
        run()
        self.ran(stream, seq)
        return False

    def queue(self, stream: int, seq: int, run: Callable[[], None]) -> None:
        self._issued[stream] = seq
        self._queue(stream).append((seq, run))
        self.deferred += 1

    def ran(self, stream: int, seq: int) -> None:
        """An op of `stream` ran when issued (its queue was empty, or was run first)."""
        self._issued[stream] = seq
        self._ran[stream] = seq

    def stall(self, stream: int, seq: int, cycles: int = 0) -> None:
        """The stall is an item of its own: a stream that waits for this one after it waits for
        the stall to end. It spins for `cycles` (from the start of the stream's queue)."""
        self._issued[stream] = seq
        queue = self._queue(stream)
        # the stall starts once what is queued before it ran; the polls count from there
        after = max((item.ends_at for _, item in queue if isinstance(item, _Stall)),
                    default=self._polls)
        queue.append((seq, _Stall(max(after, self._polls) + polls_of(cycles))))

    # --- waits between streams ---------------------------------------------------------------

    def _last(self, stream: int) -> float:
        """Where the stream's work ends now: its last issued item, or a wait queued after it
        (whatever waits for this stream from now on waits for that wait too, as on CUDA)."""
        last = self._issued.get(stream, 0)
        queue = self._queues.get(stream)
        return max(last, queue[-1][0]) if queue else last

    def record_event(self, event: int, stream: int) -> None:
        self._events[event] = (stream, self._last(stream))

    def wait_event(self, stream: int, event: int) -> None:
        known = self._events.get(event)
        if known is not None:
            self._wait(stream, *known)

    def wait_stream(self, stream: int, other: int) -> None:
        self._wait(stream, other, self._last(other))

    def _wait(self, stream: int, other: int, seq: float) -> None:
        if other == stream or self._ran.get(other, 0) >= seq or not self.pending(other):
            return
        # Between the stream's last item (or wait) and its next item: halfway to the next whole
        # step, so that waits queued one after another keep their order (a later wait is not
        # inside an earlier one's reach, and waits that reach each other do not form a cycle).
        last = self._last(stream)
        self._queue(stream).append((last + (math.floor(last) + 1 - last) / 2, _After(other, seq)))

    # --- the host waits ----------------------------------------------------------------------

    def run_stream(self, stream: int, upto: float = float("inf")) -> None:
        """Run `stream`'s queued work up to `upto` (all of it by default), and what it waits for."""
        self._run({stream: upto})

    def _run(self, needs: dict[int, float]) -> None:
        """Run what `needs` names (stream -> last seq to run) and what it waits for, the most
        recently issued ready head first: between streams that never waited for each other, the
        order a race needs to show is against issue order (a consumer ahead of its producer, a
        writer ahead of an earlier reader). A queued wait holds its stream until it is met."""
        self._close(needs)
        queues = self._queues
        lone = self._lone(needs)
        if lone is not None:
            queue, ran = queues[lone], self._ran
            upto = needs[lone]
            while queue and queue[0][0] <= upto:
                seq, item = queue.popleft()
                item()
                if ran.get(lone, 0) < seq:
                    ran[lone] = seq
            return
        stepping = None  # the stream whose replay ran a step last, while one is under way
        while True:
            ready = []
            for stream, upto in needs.items():
                queue = queues.get(stream)
                if not queue or queue[0][0] > upto:
                    continue
                item = queue[0][1]
                if isinstance(item, _After) and self._waits(item):
                    continue
                ready.append((queue[0][0], stream))
            if not ready:
                return
            others = [r for r in ready if r[1] != stepping] if stepping is not None else ready
            stream = max(others or ready)[1]
            seq, item = queues[stream][0]
            if isinstance(item, Stepped):
                stepping = stream
                try:
                    more = item.step()
                except BaseException:
                    # a step refused (a replay whose memory is gone): the rest does not run on
                    queues[stream].popleft()
                    self._ran[stream] = max(self._ran.get(stream, 0), seq)
                    raise
                if more:
                    continue
            elif stepping is not None:
                stepping = stream
            queues[stream].popleft()
            if not isinstance(item, (_After, _Stall, Stepped)):
                item()
            self._ran[stream] = max(self._ran.get(stream, 0), seq)

    def _lone(self, needs: dict[int, float]) -> int | None:
        """The one stream of `needs` with work to run, when its queue holds plain ops only (no
        wait, stall or replay in steps): then the loop of `_run` would find it the only ready
        stream at every turn and run its queue in order, so it is run so without the loop (a
        decode step under the adversarial schedule queues hundreds of ops on one stream)."""
        found = None
        queues = self._queues
        for stream, upto in needs.items():
            queue = queues.get(stream)
            if queue and queue[0][0] <= upto:
                if found is not None:
                    return None
                found = stream
        if found is None:
            return None
        for _, item in queues[found]:
            if isinstance(item, (_After, _Stall, Stepped)):
                return None
        return found

    def _waits(self, wait: _After) -> bool:
        queue = self._queues.get(wait.stream)
        return bool(queue) and queue[0][0] <= wait.seq

    def _close(self, needs: dict[int, float]) -> None:
        """Add to `needs` the work its queued waits wait for, transitively."""
        todo = list(needs.items())
        while todo:
            stream, upto = todo.pop()
            for seq, item in self._queues.get(stream, ()):
                if seq > upto:
                    break
                if isinstance(item, _After) and needs.get(item.stream, -1.0) < item.seq:
                    needs[item.stream] = item.seq
                    todo.append((item.stream, item.seq))

    def synchronize_event(self, event: int) -> None:
        known = self._events.get(event)
        if known is not None:
            self.run_stream(*known)

    def synchronize_device(self) -> None:
        self._run({stream: float("inf") for stream in self._queues})

    def poll_event(self, event: int) -> bool:
        """`Event.query()`: whether the work before `event` ran. Work still queued answers False
        once, then runs, so the next query answers True: a busy GPU gets to it meanwhile, and a
        polling loop ends."""
        known = self._events.get(event)
        if known is None or self.event_done(event):
            return True
        return self._poll("event", *known)

    def poll_stream(self, stream: int) -> bool:
        """`Stream.query()`, as `poll_event` for everything issued to `stream`."""
        if not self.pending(stream):
            return True
        return self._poll("stream", stream, self._issued.get(stream, 0))

    def _poll(self, kind: str, stream: int, seq: float) -> bool:
        if self._stall_running(stream, seq):
            self._polls += 1
            return False
        self._answered_busy = {(k, s, q) for k, s, q in self._answered_busy
                               if self._ran.get(s, 0) < q and self.pending(s)}
        if (kind, stream, seq) not in self._answered_busy:
            self._answered_busy.add((kind, stream, seq))
            return False
        self._answered_busy.discard((kind, stream, seq))
        self.run_stream(stream, seq)
        return True

    def _stall_running(self, stream: int, seq: float) -> bool:
        """Whether a stall the work up to `seq` of `stream` waits for (on its stream or, through
        queued waits, on another) still spins."""
        needs = {stream: seq}
        self._close(needs)
        polls = self._polls
        for other, upto in needs.items():
            for item_seq, item in self._queues.get(other, ()):
                if item_seq > upto:
                    break
                if isinstance(item, _Stall) and item.ends_at > polls:
                    return True
        return False

    def event_done(self, event: int) -> bool:
        """`Event.query()`: whether the work before the event has run."""
        known = self._events.get(event)
        return known is None or self._ran.get(known[0], 0) >= known[1] or not self.pending(known[0])
