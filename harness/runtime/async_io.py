"""Asynchronous copies and side streams, done right: the pieces an overlapping step loop is made
of, each with the wait that makes it correct in a small function of its own (the fault zoo's
asynchronous family removes one wait each).

- `PinnedStaging`: host-to-device inputs through pinned buffers used in turn, a buffer refilled
  only once the copy that last read it has run (`wait_until_reusable`).
- `PinnedReadback`: a device result copied into pinned memory without blocking, read on the host
  once the copy has landed (`wait_for_copy`).
- `run_on_side_stream`: work on a second stream, ordered after the producer
  (`order_side_stream`), its inputs kept for that stream when freed (`keep_for_stream`), its
  result handed back with an event to wait on.
- `StagedGraph`: a graph that re-reads a pinned input at every replay; the next step's inputs are
  written only after the previous replay ran (`wait_for_replay`).
- `all_reduce_in_graph`: a collective captured in a graph and waited for (`wait_collective`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist


def _record() -> torch.cuda.Event:
    event = torch.cuda.Event()
    event.record()
    return event


# --- host-to-device --------------------------------------------------------------------------


class PinnedStaging:
    def __init__(self, shape: Sequence[int], dtype: torch.dtype, *, slots: int = 2) -> None:
        if slots < 1:
            raise ValueError(f"slots={slots}; PinnedStaging needs at least 1 buffer")
        self.buffers = [torch.zeros(tuple(shape), dtype=dtype, pin_memory=True) for _ in range(slots)]
        self.copied: list[torch.cuda.Event | None] = [None] * slots
        self._next = 0

    def upload(self, values: torch.Tensor | Sequence, into: torch.Tensor) -> None:
        """Copy host `values` into the device tensor `into`, without waiting for the copy."""
        slot = self._next
        self._next = (slot + 1) % len(self.buffers)
        wait_until_reusable(self, slot)
        buffer = self.buffers[slot]
        buffer.copy_(values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=buffer.dtype))
        into.copy_(buffer, non_blocking=True)
        self.copied[slot] = _record()


def wait_until_reusable(staging: PinnedStaging, slot: int) -> None:
    event = staging.copied[slot]
    if event is not None:
        event.synchronize()


# --- device-to-host --------------------------------------------------------------------------


class PinnedReadback:
    def __init__(self, shape: Sequence[int], dtype: torch.dtype) -> None:
        self.host = torch.zeros(tuple(shape), dtype=dtype, pin_memory=True)
        self.copied: torch.cuda.Event | None = None

    def start(self, result: torch.Tensor) -> None:
        self.host.copy_(result, non_blocking=True)
        self.copied = _record()

    def result(self) -> list:
        """The copied values, once the copy has landed."""
        wait_for_copy(self)
        return self.host.tolist()


def wait_for_copy(readback: PinnedReadback) -> None:
    if readback.copied is not None:
        readback.copied.synchronize()


# --- side streams ----------------------------------------------------------------------------


def run_on_side_stream(fn: Callable[..., Any], *inputs: torch.Tensor,
                       stream: torch.cuda.Stream) -> tuple[Any, torch.cuda.Event]:
    """`fn(*inputs)` on `stream`, ordered after the current stream's work so far; returns its
    result and an event to wait on (`wait_event`) before using it. The inputs may be dropped
    at once: their memory is kept until the side stream is done with it."""
    producer = torch.cuda.current_stream()
    order_side_stream(stream, producer)
    with torch.cuda.stream(stream):
        out = fn(*inputs)
        done = _record()
    keep_for_stream(inputs, stream)
    return out, done


def order_side_stream(stream: torch.cuda.Stream, producer: torch.cuda.Stream) -> None:
    stream.wait_stream(producer)


def keep_for_stream(tensors: Sequence[torch.Tensor], stream: torch.cuda.Stream) -> None:
    for t in tensors:
        t.record_stream(stream)


# --- graphs ----------------------------------------------------------------------------------


class StagedGraph:
    """A graph of `step(static_input)` whose first op copies a pinned host buffer into the static
    input, so each replay reads the buffer anew: write the inputs, then `replay()`."""

    def __init__(self, step: Callable[[torch.Tensor], torch.Tensor], shape: Sequence[int],
                 dtype: torch.dtype) -> None:
        self.pinned = torch.zeros(tuple(shape), dtype=dtype, pin_memory=True)
        self.static = torch.zeros(tuple(shape), dtype=dtype, device="cuda")
        self.replayed: torch.cuda.Event | None = None

        def captured() -> torch.Tensor:
            self.static.copy_(self.pinned, non_blocking=True)
            return step(self.static)

        warmup = torch.cuda.Stream()
        warmup.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(warmup):
            captured()
        torch.cuda.current_stream().wait_stream(warmup)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.output = captured()

    def write_inputs(self, values: torch.Tensor) -> None:
        wait_for_replay(self)
        self.pinned.copy_(values)

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        self.replayed = _record()
        return self.output


def wait_for_replay(graph: StagedGraph) -> None:
    if graph.replayed is not None:
        graph.replayed.synchronize()


# --- collectives -----------------------------------------------------------------------------


def all_reduce_in_graph(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Sum `tensor` over the ranks in place, inside or outside a capture."""
    work = dist.all_reduce(tensor, group=group, async_op=True)
    wait_collective(work)
    return tensor


def wait_collective(work: Any) -> None:
    work.wait()
