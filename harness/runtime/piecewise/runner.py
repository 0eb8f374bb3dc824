"""A `PiecewiseRunner` stands in for one static partition of a split graph. It keeps one entry per
token bucket and goes through three phases that its owner selects with a `CaptureControl`: warmup
(eager runs), capture (static input buffers allocated, the partition recorded into the owner's pool),
and serving (every input at the graph's boundary copied into its static buffer, then replay; weights
and the outputs of earlier segments are read where they are). The key of
an entry is the bucket the owner announces, not the inputs' shapes, so an input of the wrong shape is
an error that names it rather than a silent miss.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from harness.graphs.base import CapturedGraph, GraphBackend

WARMUP, CAPTURE, REPLAY = "warmup", "capture", "replay"



class MissingCaptureError(RuntimeError):
    """Serving asked a runner for a bucket it never captured, and no eager fallback was allowed."""


class ReleasedPoolError(RuntimeError):
    """A capture was about to record into a pool that `clear_piecewise_graphs()` released."""


class ReplayInputError(ValueError):
    """A serving input does not fit the static buffer captured for it."""


@dataclass
class CaptureControl:
    """What the owner of a set of runners tells them: the phase and the current token bucket.
    One per compile backend (never class-level), set around each forward."""

    mode: str = REPLAY
    num_tokens: int | None = None
    segment_calls: int = 0  # runner calls since the owner last reset it: detects a bypassed graph


@dataclass
class PoolGroup:
    """Runners that capture into one pool. `clear_piecewise_graphs()` replaces `pool` by a fresh
    handle and remembers the old one in `released`.

    `static_outputs[bucket]` holds the storages of the captured outputs of the group's runners for
    that bucket: a later segment reads them where they are (a replay rewrites them in place), so
    only the inputs at the boundary of the whole graph are copied into static buffers."""

    pool: Any
    released: list[Any] = field(default_factory=list)
    static_outputs: dict[int, set[int]] = field(default_factory=dict)

    def record_outputs(self, bucket: int, output: Any) -> None:
        storages = self.static_outputs.setdefault(bucket, set())
        for tensor in _tensors(output):
            storages.add(tensor.untyped_storage().data_ptr())

    def is_static_output(self, bucket: int, tensor: torch.Tensor) -> bool:
        return tensor.untyped_storage().data_ptr() in self.static_outputs.get(bucket, ())


@dataclass
class BucketEntry:
    """One bucket of one runner."""

    warmups: int = 0
    graph: CapturedGraph | None = None
    static_inputs: tuple[Any, ...] = ()
    copied: tuple[int, ...] = ()  # indices of the inputs copied into static buffers before replay
    replays: int = 0
    eager_runs: int = 0


def is_weight(tensor: torch.Tensor) -> bool:
    """Default for `PiecewiseRunner(static_input=...)`: parameters keep their address; every other
    tensor may come from anywhere and is copied into a static buffer."""
    return isinstance(tensor, torch.nn.Parameter)


def copy_into_static(static: torch.Tensor, new: torch.Tensor, *, name: str) -> None:
    """Copy a serving input into the buffer the graph reads; a shape or dtype other than captured is
    an error naming the input (never a broadcast)."""
    if new.shape != static.shape or new.dtype != static.dtype:
        raise ReplayInputError(f"{name}: captured as {tuple(static.shape)} {static.dtype}, replayed with "
                               f"{tuple(new.shape)} {new.dtype}; a bucket's inputs keep their shape")
    if new.data_ptr() != static.data_ptr():
        static.copy_(new)


def same_pool(a: Any, b: Any) -> bool:
    """CUDA pool handles are tuples of ids (equal by value); emulated ones are arenas (by identity)."""
    return a is b or (isinstance(a, tuple) and isinstance(b, tuple) and a == b)


class PiecewiseRunner:
    """Warmup, capture and replay of one static partition, one entry per token bucket.

    - `control` (shared with the other runners of a graph) says the phase and the bucket.
    - `group` gives the pool to capture into; a pool in `group.released` is refused.
    - `static_input(tensor)` is True for inputs that keep their address (weights); every other
      tensor input is copied into a static buffer at replay.
    - `on_missing(reason)`: serving a bucket that was never captured raises `MissingCaptureError`,
      unless this is given; then the partition runs eagerly and `on_missing` counts the reason.
    """

    def __init__(self, module: Callable[..., Any], *, index: int, backend: GraphBackend,
                 control: CaptureControl, group: PoolGroup,
                 static_input: Callable[[torch.Tensor], bool] = is_weight,
                 on_missing: Callable[[str], None] | None = None) -> None:
        self.module = module
        self.index = index
        self.backend = backend
        self.control = control
        self.group = group
        self.static_input = static_input
        self.on_missing = on_missing
        self.entries: dict[int, BucketEntry] = {}

    def __call__(self, *args: Any) -> Any:
        self.control.segment_calls += 1
        bucket = self.control.num_tokens
        if bucket is None:
            raise RuntimeError(f"piecewise segment {self.index} called without a token bucket: run it "
                               f"inside the owner's bucket context")
        mode = self.control.mode
        if mode == WARMUP:
            self.entries.setdefault(bucket, BucketEntry()).warmups += 1
            return self.module(*args)
        if mode == CAPTURE:
            return self._capture(bucket, args)
        if mode != REPLAY:
            raise ValueError(f"unknown piecewise mode {mode!r}; expected {WARMUP}, {CAPTURE} or {REPLAY}")
        entry = self.entries.get(bucket)
        if entry is None or entry.graph is None:
            return self._missing(bucket, args)
        self._check_frozen_args(entry, args)
        for i in entry.copied:
            copy_into_static(entry.static_inputs[i], args[i], name=self._input_name(i))
        entry.graph.replay()
        entry.replays += 1
        return entry.graph.output

    @property
    def captured_buckets(self) -> tuple[int, ...]:
        return tuple(sorted(b for b, e in self.entries.items() if e.graph is not None))

    def reset(self) -> None:
        """Release every bucket's graph, static buffers and warmup count."""
        for entry in self.entries.values():
            if entry.graph is not None:
                entry.graph.reset()
        self.entries.clear()

    def _capture(self, bucket: int, args: tuple[Any, ...]) -> Any:
        entry = self.entries.setdefault(bucket, BucketEntry())
        if entry.graph is not None:
            raise RuntimeError(f"piecewise segment {self.index}: tokens={bucket} is captured already; "
                               f"clear_piecewise_graphs() before capturing it again")
        pool = self.group.pool
        if any(same_pool(pool, old) for old in self.group.released):
            raise ReleasedPoolError(
                f"piecewise segment {self.index}: capture for tokens={bucket} would record into pool "
                f"{pool!r}, which clear_piecewise_graphs() released; a recapture needs a fresh pool "
                f"(graph_pool_handle()), a released one may still back memory that is in use")
        # Weights, and the outputs of the segments captured before this one, are read in place.
        copied = tuple(i for i, a in enumerate(args)
                       if isinstance(a, torch.Tensor) and not self.static_input(a)
                       and not self.group.is_static_output(bucket, a))
        # Static buffers live outside the pool: they are this runner's, kept across replays.
        static_inputs = tuple(a.clone() if i in copied else a for i, a in enumerate(args))
        module = self.module
        graph = self.backend.capture(lambda: module(*static_inputs), pool=pool)
        entry.graph, entry.static_inputs, entry.copied = graph, static_inputs, copied
        # Capture ran nothing: one replay gives this call its outputs.
        graph.replay()
        entry.replays += 1
        self.group.record_outputs(bucket, graph.output)
        return graph.output

    def _missing(self, bucket: int, args: tuple[Any, ...]) -> Any:
        captured = self.captured_buckets
        reason = (f"piecewise segment {self.index}: no graph for tokens={bucket} "
                  f"(captured: {list(captured) or 'none'})")
        if self.on_missing is None:
            raise MissingCaptureError(reason + "; capture the bucket first or route the batch eagerly")
        self.on_missing(reason)
        self.entries.setdefault(bucket, BucketEntry()).eager_runs += 1
        return self.module(*args)

    def _check_frozen_args(self, entry: BucketEntry, args: tuple[Any, ...]) -> None:
        if len(args) != len(entry.static_inputs):
            raise ReplayInputError(f"piecewise segment {self.index}: captured with {len(entry.static_inputs)} "
                                   f"inputs, replayed with {len(args)}")
        for i, (captured, new) in enumerate(zip(entry.static_inputs, args)):
            if i in entry.copied:
                continue
            if isinstance(captured, torch.Tensor):
                # A weight, or an earlier segment's output, is read at its captured address: another
                # tensor in its place is not seen.
                if new is not captured and (not isinstance(new, torch.Tensor)
                                            or new.data_ptr() != captured.data_ptr()):
                    raise ReplayInputError(f"{self._input_name(i)}: a static input (a weight or an "
                                           f"earlier segment's output) was replaced after capture; the "
                                           f"graph still reads the captured tensor")
            elif not _equal_host_value(captured, new):
                raise ReplayInputError(f"{self._input_name(i)}: host value {new!r} differs from "
                                       f"{captured!r} frozen at capture")

    def _input_name(self, i: int) -> str:
        names = _placeholder_names(self.module)
        label = names[i] if i < len(names) else f"#{i}"
        return f"piecewise segment {self.index} input {i} ({label})"


def _tensors(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in _tensors(item)]
    return []


def _equal_host_value(a: Any, b: Any) -> bool:
    try:
        return bool(operator.eq(a, b))
    except Exception:  # a value without a meaningful comparison: trust identity
        return a is b


def _placeholder_names(module: Any) -> list[str]:
    graph = getattr(module, "graph", None)
    if graph is None:
        return []
    return [n.target for n in graph.nodes if n.op == "placeholder"]
