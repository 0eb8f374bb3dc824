"""What a race report says: the tensor (shape, dtype, its path where known), the two accesses
with their source lines, and what would order them."""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import NamedTuple

from harness.emulation.tracking.clocks import HOST


class RaceKind(enum.Enum):
    HOST_WRITE_PENDING = "host write while device work on the memory is pending"
    HOST_READ_PENDING = "host read before the device work writing the memory was waited for"
    UNSYNCHRONIZED_STREAMS = "streams touching the same memory without an event or wait_stream"
    FREED_IN_USE = "memory freed while another stream's work may still use it"


_REMEDY = {
    RaceKind.HOST_WRITE_PENDING: (
        "wait for that work before writing (record an event after it and call event.synchronize(), "
        "or stream.synchronize()), or write into another buffer (double-buffer the staging)"),
    RaceKind.HOST_READ_PENDING: (
        "wait for that work before reading (event.synchronize() on an event recorded after it, "
        "or stream.synchronize())"),
    RaceKind.UNSYNCHRONIZED_STREAMS: (
        "order the streams: consumer.wait_stream(producer), or record an event on the producer "
        "and consumer.wait_event(event)"),
    RaceKind.FREED_IN_USE: (
        "call tensor.record_stream(stream) on the freed tensor for each other stream that used it, "
        "or make its allocating stream wait for them (wait_stream, or wait_event on an event "
        "recorded after their work) before it allocates again"),
}


@dataclass(frozen=True)
class TensorLabel:
    """How a report names a storage: the tensor that reached it and its path from a given object."""

    shape: tuple[int, ...]
    dtype: str
    path: str = ""

    def __str__(self) -> str:
        name = f"{self.path} " if self.path else ""
        return f"tensor {name}(shape {self.shape}, {self.dtype})"


UNKNOWN_TENSOR = TensorLabel((), "unknown dtype", "<a storage the tracker was never shown>")


class Access(NamedTuple):
    """One read or write: by a stream (its id) or the host (`HOST`), at sequence number `seq`.
    Immutable as a frozen dataclass, but a tuple: made for every tracked op, and a frozen
    dataclass's `__init__` sets each field through `object.__setattr__` (0.6 us against 0.2)."""

    write: bool
    participant: int
    seq: int
    op: str
    where: object  # "file:line: source", or a callsite written out when a report names it

    def describe(self) -> str:
        by = "the host" if self.participant == HOST else f"stream {self.participant}"
        verb = "writes" if self.write else "reads"
        at = f" at {self.where}" if self.where else ""
        return f"{self.op} {verb} it on {by}{at}"


# An Access made from its five fields given as one tuple, without NamedTuple's `__new__` (a
# Python function: half the cost, and two are made for every tracked op).
new_access = functools.partial(tuple.__new__, Access)


@dataclass(frozen=True)
class Reuse:
    """How freed memory met its race: the free (its stream and line) and the tensor made from the
    memory again, which `current` of the report touches."""

    free: Access
    tensor: TensorLabel | None = None  # None: the stream's next allocation, not made yet

    def describe(self) -> str:
        at = f" at {self.free.where}" if self.free.where else ""
        now = (f"may be {self.tensor} now" if self.tensor is not None
               else "goes to the stream's next allocation")
        return f"{self.free.op} on stream {self.free.participant}{at}; its memory {now}"


@dataclass(frozen=True)
class RaceReport:
    kind: RaceKind
    tensor: TensorLabel
    current: Access
    previous: Access
    reuse: Reuse | None = None  # FREED_IN_USE: the free and the tensor made again

    def __str__(self) -> str:
        freed = f"Freed: {self.reuse.describe()}. " if self.reuse is not None else ""
        return (f"race on {self.tensor}: {self.kind.value}. {freed}Now: {self.current.describe()}; "
                f"before, not waited for: {self.previous.describe()}. Fix: {_REMEDY[self.kind]}")


class RaceWarning(UserWarning):
    """A race found in report mode (it is also kept in the tracker's `reports`)."""


class RaceError(RuntimeError):
    """A race found in strict mode; `report` says which (a `RaceReport`)."""

    def __init__(self, report: RaceReport) -> None:
        super().__init__(str(report))
        self.report = report
