"""Per storage, the last writer and the readers since, by stream or host, checked against the
clocks (clocks.py) at every access. Strict mode raises `RaceError` at the first race; report mode
collects `RaceReport`s in `reports`.

Storages are named by an int key (the emulated device uses the storage's data pointer); `labels`
maps keys to `TensorLabel`s for reports, filled by whoever knows the tensors (`name_tensors`).
Host accesses are checked only for storages some device op touched: a host buffer that never took
part in asynchronous work has nothing pending.
"""

from __future__ import annotations

import warnings

from typing import Callable, Iterable

from harness.emulation.tracking.clocks import HOST, Clocks
from harness.emulation.tracking.races import (UNKNOWN_TENSOR, Access, RaceError, RaceKind,
                                                   RaceReport, RaceWarning, TensorLabel)
from harness.emulation.tracking.unseen_writes import UNSEEN_HOST_WRITE

MODES = ("strict", "report")


_NO_STREAMS: frozenset[int] = frozenset()


class _StorageState:
    # A plain slotted class, not a dataclass: one is made for every result of every device op.
    __slots__ = ("write", "reads", "recorded_streams", "writes")

    def __init__(self, write: Access | None = None, writes: int = 0) -> None:
        self.write = write
        self.reads: dict[int, Access] = {}  # the latest read per participant
        self.recorded_streams: frozenset[int] = _NO_STREAMS  # grown by record_stream only
        self.writes = writes  # tracked writes so far, by anyone: unchanged means none came between


class StreamTracker:
    def __init__(self, *, mode: str = "strict",
                 describe: Callable[[int], TensorLabel | None] | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}; accepted: {', '.join(MODES)}")
        self.mode = mode
        self.clocks = Clocks()
        self.labels: dict[int, TensorLabel] = {}
        self.reports: list[RaceReport] = []
        self._describe = describe
        self._storages: dict[int, _StorageState] = {}
        self._reported: set[tuple] = set()  # one report per race, however many calls meet it

    # --- device work -------------------------------------------------------------------------

    def launch(self, stream: int, reads: Iterable[int] = (), writes: Iterable[int] = (), *,
               op: str = "", where: str = "") -> int:
        """A device op on `stream` reading and writing the given storages; returns its seq."""
        seq = self.clocks.launch(stream)
        written = writes if isinstance(writes, (set, frozenset)) else set(writes) if writes else ()
        storages = self._storages
        ordered = self.clocks.ordered
        read_access = Access(False, stream, seq, op, where)
        for key in reads:
            if key in written:
                continue
            state = storages.get(key)
            if state is None:
                state = storages[key] = _StorageState()
            previous = state.write
            if previous is not None and previous.participant != stream and \
                    not ordered(stream, previous.participant, previous.seq):
                self._race(RaceKind.UNSYNCHRONIZED_STREAMS, key, read_access, previous)
            state.reads[stream] = read_access
        if written:
            write_access = Access(True, stream, seq, op, where)
            for key in written:
                state = storages.get(key)
                if state is None:
                    state = storages[key] = _StorageState()
                elif not self._only_by(stream, state):
                    for previous in self._pending_for(stream, state):
                        self._race(RaceKind.UNSYNCHRONIZED_STREAMS, key, write_access, previous)
                        break
                state.write = write_access
                state.writes += 1
                if state.reads:
                    state.reads = {}
        return seq

    def record_write(self, key: int, stream: int, seq: int, *, op: str = "", where: str = "") -> None:
        """A fresh result of op `seq` on `stream`: written by it, known to no one else yet."""
        self.record_fresh(key, Access(True, stream, seq, op, where))

    def record_fresh(self, key: int, write: Access) -> None:
        """`record_write` with the op's write access made by the caller, once for all its results."""
        state = self._storages.get(key)
        if state is None:
            self._storages[key] = _StorageState(write, 1)
            return
        state.write = write
        state.writes += 1
        if state.reads:
            state.reads = {}
        state.recorded_streams = _NO_STREAMS

    @staticmethod
    def _only_by(stream: int, state: _StorageState) -> bool:
        """Whether only `stream` touched the storage since its last write (the common case of a
        replay after a replay on the same stream): nothing to check."""
        write, reads = state.write, state.reads
        return ((write is None or write.participant == stream)
                and (not reads or (len(reads) == 1 and stream in reads)))

    def _pending_for(self, participant: int, state: _StorageState) -> list[Access]:
        """The accesses to a storage that `participant` is not ordered after (host accesses never
        are pending: the host issued every later op after them)."""
        earlier = list(state.reads.values()) or ([state.write] if state.write else [])
        if state.reads and state.write is not None:
            earlier.append(state.write)
        return [a for a in earlier if a.participant != HOST
                and not self.clocks.ordered(participant, a.participant, a.seq)]

    # --- host accesses -----------------------------------------------------------------------

    def host_read(self, key: int, *, op: str = "host read", where: str = "") -> None:
        state = self._storages.get(key)
        if state is None or state.write is None or state.write.participant == HOST:
            return
        if not self.clocks.ordered(HOST, state.write.participant, state.write.seq):
            self._race(RaceKind.HOST_READ_PENDING, key, Access(False, HOST, 0, op, where), state.write)

    def host_write(self, key: int, *, op: str = "host write", where: str = "") -> None:
        state = self._storages.get(key)
        if state is None:
            return
        pending = self._pending_for(HOST, state)
        if pending:
            self._race(RaceKind.HOST_WRITE_PENDING, key, Access(True, HOST, 0, op, where), pending[0])
        # Every later device op is issued after this write, so nothing before it can race again.
        state.write = None
        state.writes += 1
        state.reads = {}

    def writes_so_far(self, key: int) -> int:
        state = self._storages.get(key)
        return 0 if state is None else state.writes

    def unseen_host_write(self, key: int, read: Access, writes_at_issue: int) -> None:
        """A queued op (`read`) found the storage it reads changed since it was issued: a race,
        unless a tracked write came between (reported, or ordered, already)."""
        state = self._storages.get(key)
        if state is None or state.writes != writes_at_issue:
            return
        self._race(RaceKind.HOST_WRITE_PENDING, key, Access(True, HOST, 0, UNSEEN_HOST_WRITE, ""),
                   read)

    def pending_device_write(self, key: int, queued: Callable[[int, int], bool]) -> bool:
        """Whether the storage's last tracked write is a device op that `queued(stream, seq)` says
        has yet to run."""
        state = self._storages.get(key)
        write = None if state is None else state.write
        return write is not None and write.participant != HOST and queued(write.participant, write.seq)

    # --- synchronization ---------------------------------------------------------------------

    def record_event(self, event: int, stream: int) -> None:
        self.clocks.record_event(event, stream)

    def wait_event(self, stream: int, event: int) -> None:
        self.clocks.wait_event(stream, event)

    def wait_stream(self, stream: int, other: int) -> None:
        self.clocks.wait_stream(stream, other)

    def synchronize_event(self, event: int) -> None:
        self.clocks.synchronize_event(event)

    def synchronize_stream(self, stream: int) -> None:
        self.clocks.synchronize_stream(stream)

    def synchronize_device(self) -> None:
        self.clocks.synchronize_device()

    # --- allocation --------------------------------------------------------------------------

    def record_stream(self, key: int, stream: int) -> None:
        """`tensor.record_stream(stream)`: the allocator keeps the memory until `stream`'s work
        issued so far is done."""
        state = self._storages.get(key)
        if state is None:
            state = self._storages[key] = _StorageState()
        state.recorded_streams = state.recorded_streams | {stream}

    def free(self, key: int, allocation_stream: int, *,
             where: str | Callable[[], object] = "") -> None:
        """The last reference to a storage allocated on `allocation_stream` was dropped: the
        caching allocator may hand it to that stream's next allocation at once. Its label goes
        with it (reported first if the free races): the next tensor at that address is another.
        `where` may be a call that finds the line, made only for a free that races (the host is
        still inside the free then; most frees race with nothing)."""
        try:
            self._check_free(key, allocation_stream, where)
        finally:
            self.labels.pop(key, None)

    def _check_free(self, key: int, allocation_stream: int,
                    where: str | Callable[[], object]) -> None:
        state = self._storages.pop(key, None)
        if state is None:
            return
        accesses = [*state.reads.values(), *([state.write] if state.write else [])]
        for access in accesses:
            if (access.participant in (HOST, allocation_stream)
                    or access.participant in state.recorded_streams):
                continue
            if not self.clocks.ordered(allocation_stream, access.participant, access.seq):
                freed = Access(True, allocation_stream, 0, "free (last reference dropped)",
                               where() if callable(where) else where)
                self._race(RaceKind.FREED_IN_USE, key, freed, access)
                return

    def forget(self, key: int) -> None:
        """Drop what is known of a storage without checking it (its memory left the device)."""
        self._storages.pop(key, None)
        self.labels.pop(key, None)

    def pending_streams(self, key: int) -> set[int]:
        """The streams with work on a storage the host has not waited for."""
        state = self._storages.get(key)
        if state is None:
            return set()
        return {a.participant for a in self._pending_for(HOST, state)}

    # --- reports -----------------------------------------------------------------------------

    def _label(self, key: int) -> TensorLabel:
        label = self.labels.get(key)
        if label is None and self._describe is not None:
            label = self._describe(key)
        return label or UNKNOWN_TENSOR

    def _race(self, kind: RaceKind, key: int, current: Access, previous: Access) -> None:
        seen = (kind, key, previous.participant, previous.seq, current.participant, current.seq)
        if seen in self._reported:
            return  # `item()` reaches the tracker twice: through the device API and aten
        self._reported.add(seen)
        report = RaceReport(kind, self._label(key), current, previous)
        if self.mode == "strict":
            raise RaceError(report)
        self.reports.append(report)
        # Collected, not raised: still said where it happened (pytest lists it with its test).
        warnings.warn(RaceWarning(str(report)), stacklevel=2)
