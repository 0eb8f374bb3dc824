"""The overlap step loop (`EngineConfig.overlap`), as TensorRT-LLM's overlap scheduler runs it.

Without overlap a step is: schedule, prepare, run, read the tokens (a device-to-host sync), record.
The host idles while the device runs, and the device idles while the host schedules. With overlap
the host works one step ahead:

    schedule step n + 1        (the host has read step n - 1; step n is queued on the device)
    stage its inputs           (pinned staging buffers, two in turn: step n's may still be unread)
    launch it                  (its pending tokens are fed from step n's sampled tokens, on the
                                device; sampling runs on the device too; the packed ranking is
                                copied into pinned host memory with non_blocking=True, and an event
                                is recorded behind the copy)
    read step n                (wait for step n's event, then read its pinned buffer)

So a request is known to have finished one step late: step n + 1 was launched before step n was
read, and it computed one more token for every request that step n finished. That token is dropped
when step n + 1 is read (TensorRT-LLM documents the same extra step), and the generations are the
ones of the loop without overlap; each request reserves KV room for the extra token.

Each ordering the loop relies on is one of its classic bugs when missing: a staging buffer rewritten
while the device has yet to read it, tokens read before their event, inputs written outside the
stream order while a replay is in flight. On a CPU device every copy is synchronous and none of
them can show; on CUDA, and on the emulated CUDA device (`harness.emulate_cuda()`, whose adversarial
schedule defers every copy, event and replay until something waits for it), each shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from harness.ops.current_stream import stream_device
from harness.ranking import pack_ranking, rank_logits, steps_from_packed
from harness.runtime.scheduler import ScheduledBatch, Scheduler
from harness.runtime.stats import BatchRecord

STAGING_BUFFERS = 2  # one being filled by the host, one that the device may still have to read


@dataclass(frozen=True)
class TokenFeed:
    """Token rows of a step whose ids are still on the device: `rows[i]` takes row `sources[i]` of
    the previous step's sampled `tokens`."""

    tokens: torch.Tensor  # [previous step's rows] int64, on the device
    rows: tuple[int, ...]
    sources: tuple[int, ...]


@dataclass
class InFlightStep:
    """A launched step the host has not read yet."""

    batch: ScheduledBatch
    producer: str
    tokens: torch.Tensor  # [rows] int64 on the device: each row's sampled token
    packed: torch.Tensor  # pinned host [num_seqs, 2 * width + 1]: valid once `copied` has passed
    copied: torch.cuda.Event | None


def copy_to_device(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy host `src` into device `dst` on the current stream: in stream order, after any queued
    replay that reads `dst`, and without blocking the host (`src` is pinned on cuda)."""
    dst.copy_(src, non_blocking=True)


def wait_for_tokens(step: InFlightStep) -> None:
    """Block until the step's packed ranking has reached host memory."""
    if step.copied is not None:
        step.copied.synchronize()


class PinnedTurns:
    """`STAGING_BUFFERS` pinned host buffers (plain host memory on a cpu device) used in turn, each
    with the event of the last copy that read or wrote it."""

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device) -> None:
        pinned = device.type == "cuda"
        self.device = device
        self._stream_device = stream_device(device)
        self.buffers = tuple(torch.zeros(numel, dtype=dtype, pin_memory=pinned)
                             for _ in range(STAGING_BUFFERS))
        self.events = tuple(torch.cuda.Event() if pinned else None for _ in self.buffers)
        self._turn = 0
        # (turn, shape) -> that buffer's leading elements viewed as `shape`: the same few shapes
        # every step, so each view is made once.
        self._views: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}

    def _advance(self) -> int:
        """The next turn, once the copy that last used its buffer is done (two steps ago: no wait
        on a queue no deeper than one step)."""
        turn = self._turn
        self._turn = (turn + 1) % len(self.buffers)
        event = self.events[turn]
        if event is not None:
            event.synchronize()
        return turn

    def next(self) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """The next buffer and its event (see `_advance`)."""
        turn = self._advance()
        return self.buffers[turn], self.events[turn]

    def next_view(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """The next buffer's leading elements as `shape`, and its event (see `_advance`)."""
        turn = self._advance()
        view = self._views.get((turn, shape))
        if view is None:
            buffer = self.buffers[turn]
            numel = math.prod(shape)
            if numel > buffer.numel():
                raise RuntimeError(f"{shape} does not fit a staging buffer of {buffer.numel()} "
                                   f"elements")
            view = self._views[(turn, shape)] = buffer[:numel].view(shape)
        return view, self.events[turn]

    def record(self, event: torch.cuda.Event | None) -> None:
        if event is not None:
            event.record(torch.cuda.current_stream(self._stream_device))


class InputFeed:
    """How the overlap loop writes a step's token ids into the engine's `input_ids`: the host-known
    ids through pinned staging, then the pending ones from the previous step's tokens, on the
    device. `feed` is set by the loop around each launch (None during capture)."""

    def __init__(self, input_ids: torch.Tensor, max_batch_size: int) -> None:
        device = input_ids.device
        self.staging = PinnedTurns(input_ids.shape[0] + 2 * max_batch_size, torch.int64, device)
        self.rows = torch.zeros(2 * max_batch_size, dtype=torch.int64, device=device)
        self.feed: TokenFeed | None = None

    def write(self, input_ids: torch.Tensor, ids: list[int]) -> None:
        n = len(ids)
        feed = self.feed
        if feed is not None and feed.rows == feed.sources == tuple(range(n)):
            # Every row, in order, takes the previous step's token of the same row (a steady decode
            # batch without padding): no id is known on the host, so one device copy is the write.
            tokens = feed.tokens
            input_ids[:n].copy_(tokens if tokens.shape[0] == n else tokens[:n])
            return
        rows = feed.rows if feed is not None else ()
        sources = feed.sources if feed is not None else ()
        staging, event = self.staging.next()
        host = staging.numpy()
        host[:n] = ids
        host[n:n + len(rows)] = rows
        host[n + len(rows):n + 2 * len(rows)] = sources
        copy_to_device(input_ids[:n], staging[:n])
        if rows:
            copy_to_device(self.rows[:2 * len(rows)], staging[n:n + 2 * len(rows)])
        self.staging.record(event)
        if rows:
            r = len(rows)
            input_ids.index_copy_(0, self.rows[:r], feed.tokens.index_select(0, self.rows[r:2 * r]))


def token_feed(batch: ScheduledBatch, previous: InFlightStep | None) -> TokenFeed | None:
    """Which of `batch`'s token rows take a token sampled by `previous` (every sequence with a
    pending token: its last new token)."""
    if previous is None:
        return None
    source_of = {id(s): i for i, s in enumerate(previous.batch.sequences)}
    rows, sources, end = [], [], 0
    for sequence, span in zip(batch.sequences, batch.spans):
        end += span.query_len
        if sequence.pending:
            if sequence.pending != 1 or id(sequence) not in source_of:
                raise RuntimeError(f"request {sequence.index} has {sequence.pending} pending tokens "
                                   f"that the step in flight did not sample: an overlap loop bug")
            rows.append(end - 1)
            sources.append(source_of[id(sequence)])
    return TokenFeed(previous.tokens, tuple(rows), tuple(sources)) if rows else None


class OverlapLoop:
    """Runs a scheduler to completion on `engine` with one step in flight (see the module text).

    `engine` provides `_forward(batch) -> ForwardResult`, `input_feed`, `before_launch`, its config,
    device and stats recorder. `max_width`: the most logprobs any request of the run asks for."""

    def __init__(self, engine: Any, max_width: int) -> None:
        self.engine = engine
        # A graph that ranks on the device packs its own k entries, which may exceed every request's.
        self.width_capacity = max(max_width, 1, *engine.config.graph_top_k)
        rows = engine.config.max_batch_size
        self.outputs = PinnedTurns(rows * (2 * self.width_capacity + 1), torch.float32, engine.device)
        self.dropped = 0

    def run(self, scheduler: Scheduler) -> None:
        in_flight: InFlightStep | None = None
        while not scheduler.done:
            batch = scheduler.schedule()
            launched = self.launch(batch, in_flight)
            scheduler.launched(batch)
            if in_flight is not None:
                self.read(in_flight, scheduler)
            in_flight = launched
        if in_flight is not None:
            self.read(in_flight, scheduler)

    def launch(self, batch: ScheduledBatch, previous: InFlightStep | None) -> InFlightStep:
        engine = self.engine
        hook: Callable[[], None] | None = engine.before_launch
        if hook is not None:
            hook()
        engine.input_feed.feed = token_feed(batch, previous)
        try:
            # A graph's static output needs no copy: its one transfer and the next step's token
            # feed are queued before the next replay.
            result = engine._forward(batch, copy=False)
        finally:
            engine.input_feed.feed = None
        n = batch.num_seqs
        packed = result.packed
        if packed is None:
            width = max(max((s.request.logprobs for s in batch.sequences), default=0), 1)
            packed = pack_ranking(rank_logits(result.logits, width), n, width)
        values = packed.values  # the batch's real rows, from a graph and from pack_ranking alike
        capacity = self.outputs.buffers[0].numel()
        if values.numel() > capacity:
            raise RuntimeError(f"a packed ranking of {tuple(values.shape)} exceeds the pinned output "
                               f"buffer of {capacity} values (max_batch_size x (2 x "
                               f"{self.width_capacity} + 1)): an overlap loop bug")
        host, event = self.outputs.next_view(values.shape)
        host.copy_(values, non_blocking=True)
        self.outputs.record(event)
        engine._stats.record_batch(BatchRecord(kind=batch.kind, num_seqs=batch.num_seqs,
                                               num_tokens=batch.num_tokens, producer=result.producer,
                                               free_blocks=engine.num_free_blocks))
        return InFlightStep(batch=batch, producer=result.producer, tokens=packed.tokens,
                            packed=host, copied=event)

    def read(self, step: InFlightStep, scheduler: Scheduler) -> None:
        """Wait for the step's tokens, record them, and retire the sequences they finish."""
        wait_for_tokens(step)
        steps = steps_from_packed(step.packed, [s.request.logprobs for s in step.batch.sequences],
                                  step.producer)
        for sequence, record in zip(step.batch.sequences, steps):
            sequence.pending -= 1
            if sequence.finished:  # the extra step after its last token: dropped
                self.dropped += 1
                continue
            sequence.steps.append(record)
            sequence.tokens.append(record.token)
        scheduler.retire_finished()
