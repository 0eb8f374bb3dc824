"""Per storage, the last writer and the readers since, by stream or host, checked against the
clocks (clocks.py) at every access. Strict mode raises `RaceError` at the first race; report mode
collects `RaceReport`s in `reports`.

Storages are named by an int key (the emulated device uses the storage's data pointer); `labels`
maps keys to `TensorLabel`s for reports, filled by whoever knows the tensors (`name_tensors`).
Host accesses are checked only for storages some device op touched: a host buffer that never took
part in asynchronous work has nothing pending.

A free is no race by itself: the block goes back to its allocating stream's pool, and the race is
memory made from it again being touched before another stream's pending access to the freed tensor
is done (freed_blocks.py). A free notes the block with those accesses; `allocate` notes which new
storages may be made of it, and their first access is checked against them.
"""

from __future__ import annotations

import warnings

from typing import Callable, Iterable

from harness.emulation.tracking.clocks import HOST, Clocks
from harness.emulation.tracking.freed_blocks import FreedBlock, FreedBlocks, pool_of
from harness.emulation.tracking.races import (UNKNOWN_TENSOR, Access, RaceError, RaceKind,
                                                   RaceReport, RaceWarning, Reuse, TensorLabel,
                                                   new_access)
from harness.emulation.tracking.unseen_writes import UNSEEN_HOST_WRITE

MODES = ("strict", "report")


_NO_STREAMS: frozenset[int] = frozenset()


class _StorageState:
    # A plain slotted class, not a dataclass: one is made for every result of every device op.
    __slots__ = ("write", "reads", "recorded_streams", "writes")

    def __init__(self, write: Access | None = None, writes: int = 0,
                 reads: dict[int, Access] | None = None) -> None:
        self.write = write
        self.reads: dict[int, Access] = {} if reads is None else reads  # the latest per participant
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
        self._freed = FreedBlocks()
        self._reported: set[tuple] = set()  # one report per race, however many calls meet it

    # --- device work -------------------------------------------------------------------------

    def launch(self, stream: int, reads: Iterable[int] = (), writes: Iterable[int] = (), *,
               op: str = "", where: str = "") -> int:
        """A device op on `stream` reading and writing the given storages; returns its seq."""
        seq = self.clocks.launch(stream)
        storages = self._storages
        read_access = new_access((False, stream, seq, op, where))
        if not writes and not self._freed.reuses:
            # The hot path (most ops: reads and a fresh result, no freed block pending): a read
            # is checked only against a last write of another stream, and always noted, as a
            # later write of another stream must be ordered after it.
            for key in reads:
                state = storages.get(key)
                if state is None:
                    storages[key] = _StorageState(None, 0, {stream: read_access})
                    continue
                previous = state.write
                if previous is not None and previous.participant != stream and \
                        not self.clocks.ordered(stream, previous.participant, previous.seq):
                    self._race(RaceKind.UNSYNCHRONIZED_STREAMS, key, read_access, previous)
                state.reads[stream] = read_access
            return seq
        written = writes if isinstance(writes, (set, frozenset)) else set(writes) if writes else ()
        ordered = self.clocks.ordered
        reuses = self._freed.reuses
        if reuses:
            for key in reads:
                if key in reuses and key not in written:
                    self._first_touch(key, read_access)
            for key in written:
                if key in reuses:
                    self._first_touch(key, Access(True, stream, seq, op, where))
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
            write_access = new_access((True, stream, seq, op, where))
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

    def record_fresh(self, key: int, write: Access, *, touched: bool = True) -> None:
        """`record_write` with the op's write access made by the caller, once for all its results.
        `touched=False`: the op only allocated the memory (`torch.empty`), touching none of it."""
        if touched and key in self._freed.reuses:
            self._first_touch(key, write)
        state = self._storages.get(key)
        if state is None:
            self._storages[key] = _StorageState(write, 1)
            return
        state.write = write
        state.writes += 1
        if state.reads:
            state.reads = {}
        state.recorded_streams = _NO_STREAMS

    def touched_only_by(self, key: int, stream: int) -> bool:
        """Whether nothing but `stream` touched the storage since its last write (or nothing at
        all): its free then leaves no access pending (`free`)."""
        state = self._storages.get(key)
        return state is None or self._only_by(stream, state)

    def record_allocated(self, key: int, nbytes: int, write: Access, *,
                         touched: bool = True) -> None:
        """`allocate` on the write's stream, then `record_fresh`: the result of op `write`, a
        storage of `nbytes` made now. One call for every learned call's result."""
        freed = self._freed
        if freed.active():
            freed.allocated(key, write.participant, nbytes, self.clocks.ordered)
            if touched and key in freed.reuses:
                self._first_touch(key, write)
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

    def allocate(self, key: int, stream: int, nbytes: int) -> None:
        """A new device storage of `nbytes` on `stream` (not yet touched): it may be made of a block
        freed on that stream while another stream's access was pending; its first access says."""
        if self._freed.active():
            self._freed.allocated(key, stream, nbytes, self.clocks.ordered)

    def free(self, key: int, allocation_stream: int, *, nbytes: int = 1,
             where: str | Callable[[], object] = "") -> None:
        """The last reference to a storage of `nbytes` allocated on `allocation_stream` was
        dropped: the caching allocator may hand its block to that stream's next allocation at
        once, which races if touched before the other streams' pending accesses are done. Its
        label goes with it (kept with the block if accesses are pending): the next tensor at that
        address is another. `where` may be a call that finds the line, made only for a free with
        accesses pending (the host is still inside the free then; most frees have none)."""
        label = self.labels.pop(key, None)
        self._freed.reuses.pop(key, None)  # _freed.forget, inlined: every device storage's free
        state = self._storages.pop(key, None)
        if state is None:
            return
        write, reads = state.write, state.reads
        if (write is None or write.participant == allocation_stream) and (
                not reads or (len(reads) == 1 and allocation_stream in reads)):
            return  # nothing but its own stream touched it since its last write (_only_by)
        accesses = [*state.reads.values(), *([state.write] if state.write else [])]
        pending = tuple(a for a in accesses
                        if a.participant not in (HOST, allocation_stream)
                        and a.participant not in state.recorded_streams
                        and not self.clocks.ordered(allocation_stream, a.participant, a.seq))
        if pending:
            if label is None and self._describe is not None:
                label = self._describe(key)
            free = Access(True, allocation_stream, 0, "free (last reference dropped)",
                          str(where()) if callable(where) else where)
            self._freed.freed(FreedBlock(allocation_stream, pool_of(nbytes), label or UNKNOWN_TENSOR,
                                         free, pending))

    def _first_touch(self, key: int, access: Access) -> None:
        found = self._freed.first_touch(key, access.participant, self.clocks.ordered)
        if found is not None:
            block, pending = found
            self._race(RaceKind.FREED_IN_USE, key, access, pending,
                       reuse=Reuse(block.free, self._label(key)), label=block.label)

    def frees_left_on(self, stream: int, *, op: str, where: str = "") -> None:
        """Judge the blocks freed on `stream` that its work is not yet ordered after as if an
        allocation made now touched them (`op`): where no later work of the program can still
        order them (a pytest session's next test allocates on the stream without knowing)."""
        for block, pending in self._freed.left_on(stream, self.clocks.ordered):
            self._freed.reported(block)
            self._race(RaceKind.FREED_IN_USE, id(block), Access(True, stream, 0, op, where),
                       pending, reuse=Reuse(block.free), label=block.label)

    def streams_with_frees(self) -> list[int]:
        """The streams with freed blocks another stream's access may still be pending on."""
        return self._freed.streams()

    def forget(self, key: int) -> None:
        """Drop what is known of a storage without checking it (its memory left the device)."""
        self._storages.pop(key, None)
        self.labels.pop(key, None)
        self._freed.forget(key)

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

    def _race(self, kind: RaceKind, key: int, current: Access, previous: Access, *,
              label: TensorLabel | None = None, reuse: Reuse | None = None) -> None:
        seen = (kind, key, previous.participant, previous.seq, current.participant, current.seq)
        if seen in self._reported:
            return  # `item()` reaches the tracker twice: through the device API and aten
        self._reported.add(seen)
        report = RaceReport(kind, label or self._label(key), current, previous, reuse)
        if self.mode == "strict":
            raise RaceError(report)
        self.reports.append(report)
        # Collected, not raised: still said where it happened (pytest lists it with its test).
        warnings.warn(RaceWarning(str(report)), stacklevel=2)
