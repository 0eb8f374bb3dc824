"""Decode graphs, one per key: padding, capture under a scope, replay, pointer records, strict check.

A key is a batch size and a sampling variant: "greedy" for a graph that outputs logits (the host
ranks them), f"top{k}" for one that ranks the best k tokens on the device (`sampling_variant`). A decode batch of n sequences replays the graph of the
smallest captured size >= n: the real sequences fill the first rows, dummy rows the tail. Dummy rows
have length 0, write their K/V to the cache's pad sink and own no KV block, so they never touch a
live sequence's blocks; their logits are dropped.

A graph bakes in the address of every buffer it reads. `capture(..., record=True)` records the
addresses of every tensor reachable from the runner's roots (attention metadata, workspace, input
ids, KV cache); `moved_tensors()` compares them with the present, and strict mode does so before
every replay and raises, naming the path and the old and new address.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Mapping

from harness.graphs.base import CapturedGraph, GraphBackend
from harness.graphs.pointers import TensorRecord, describe_moved_tensor, moved_tensors, snapshot_tensors
from harness.ops.metadata import SequenceSpan
from harness.ops.sizing import smallest_fitting

GREEDY = "greedy"


def sampling_variant(top_k: int | None) -> str:
    """The variant of a graph that ranks `top_k` logprobs on the device; None: logits out."""
    return GREEDY if top_k is None else f"top{top_k}"


@dataclass(frozen=True, order=True)
class DecodeGraphKey:
    """What one decode graph was captured for. `str(key)` is the `Step.producer` of its steps."""

    batch_size: int
    sampling: str = GREEDY

    @classmethod
    def of(cls, batch_size: int, sampling: str = GREEDY) -> DecodeGraphKey:
        return cls(batch_size=batch_size, sampling=sampling)

    def __str__(self) -> str:
        return f"decode[bs={self.batch_size},{self.sampling}]"


@dataclass(frozen=True)
class PaddedDecodeBatch:
    """Spans to prepare and the padded shape: `num_seqs` sequence rows and `num_tokens` token rows
    (one per sequence for a decode). Rows past the real spans are the metadata's dummy rows."""

    spans: tuple[SequenceSpan, ...]
    num_seqs: int
    num_tokens: int


def pad_decode_batch(spans: tuple[SequenceSpan, ...], size: int) -> PaddedDecodeBatch:
    """The dummy-row builder: real spans first, then `size - len(spans)` dummy rows at the tail, which
    `AttentionMetadata.prepare` points at the pad sink (seq_len 0, pad-block table, pad slot)."""
    if len(spans) > size:
        raise ValueError(f"a decode batch of {len(spans)} does not fit a graph of size {size}")
    return PaddedDecodeBatch(spans=tuple(spans), num_seqs=size, num_tokens=size)


class StaleGraphBufferError(RuntimeError):
    """Strict mode: a tensor a captured graph baked in has moved since capture."""


class GraphShapeError(ValueError):
    """A replay was asked for a batch whose prepared shape is not the captured one."""


@dataclass
class CapturedDecodeGraph:
    graph: CapturedGraph
    records: Mapping[str, TensorRecord] | None


Roots = Callable[[], Mapping[str, Any]]
CaptureScope = Callable[[], ContextManager[Any]]


class GraphRunner:
    """Captured decode graphs by key, all in one pool.

    `roots()` returns the objects whose tensors graphs read, by name, as they are now (a KV cache
    reallocated for phase 2 shows up as a new object). `prepared_shape()` returns the (num_seqs,
    num_tokens) the metadata is prepared for, checked at every replay.
    """

    def __init__(self, backend: GraphBackend, roots: Roots,
                 prepared_shape: Callable[[], tuple[int, int]], *, strict: bool = False) -> None:
        self.backend = backend
        self.roots = roots
        self.prepared_shape = prepared_shape
        self.strict = strict
        self.pool = backend.graph_pool_handle()
        self._entries: dict[DecodeGraphKey, CapturedDecodeGraph] = {}
        # Sorted once per capture or clear, not at every step that asks which graph to replay.
        self._sorted_keys: tuple[DecodeGraphKey, ...] = ()
        self._generation = 0

    @property
    def keys(self) -> list[DecodeGraphKey]:
        return list(self._sorted_keys)

    @property
    def generation(self) -> int:
        """Counts the captures and clears so far: what a cache of per-key answers is valid for."""
        return self._generation

    def _entries_changed(self) -> None:
        self._sorted_keys = tuple(sorted(self._entries))
        self._generation += 1

    def __contains__(self, key: DecodeGraphKey) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def key_for(self, batch_size: int, sampling: str = GREEDY) -> DecodeGraphKey | None:
        """The smallest captured key of this sampling variant that fits `batch_size`, or None."""
        size = smallest_fitting(batch_size, (k.batch_size for k in self._entries if k.sampling == sampling))
        return None if size is None else DecodeGraphKey.of(size, sampling)

    def records(self, key: DecodeGraphKey) -> Mapping[str, TensorRecord] | None:
        """The addresses `key`'s graph baked in, by path (None: captured without records)."""
        return self._entries[key].records

    def snapshot(self) -> dict[str, TensorRecord]:
        records: dict[str, TensorRecord] = {}
        for name, root in self.roots().items():
            records.update(snapshot_tensors(root, name))
        return records

    def capture(self, key: DecodeGraphKey, fn: Callable[[], Any], *,
                scope: CaptureScope | None = None, record: bool = False) -> CapturedGraph:
        """Capture `fn()` for `key` under `scope()` (the serving scope the graph keeps)."""
        if key in self._entries:
            raise ValueError(f"decode graph {key} is already captured; clear() before capturing again")
        with (scope() if scope is not None else contextlib.nullcontext()):
            graph = self.backend.capture(fn, pool=self.pool)
        records = self.snapshot() if (record or self.strict) else None
        self._entries[key] = CapturedDecodeGraph(graph, records)
        self._entries_changed()
        return graph

    def replay(self, key: DecodeGraphKey) -> Any:
        """Replay `key`'s graph against the prepared metadata; returns its static output."""
        entry = self._entries.get(key)
        if entry is None:
            raise KeyError(f"no decode graph for {key}; captured: {[str(k) for k in self.keys]}")
        num_seqs, num_tokens = self.prepared_shape()
        if (num_seqs, num_tokens) != (key.batch_size, key.batch_size):
            raise GraphShapeError(
                f"decode graph {key} was captured for {key.batch_size} sequences and "
                f"{key.batch_size} token rows, but the metadata is prepared for {num_seqs} sequences "
                f"and {num_tokens} token rows; pad the batch to the graph's size before replaying")
        if self.strict:
            self.check_pointers(key)
        entry.graph.replay()
        return entry.graph.output

    def check_pointers(self, key: DecodeGraphKey) -> None:
        """Raise StaleGraphBufferError if a tensor `key`'s graph recorded has moved."""
        records = self._entries[key].records
        if records is None:
            raise ValueError(f"decode graph {key} was captured without pointer records")
        now = self.snapshot()
        moved = moved_tensors(records, now)
        if moved:
            lines = "\n".join(describe_moved_tensor(p, records[p], now.get(p)) for p in moved)
            raise StaleGraphBufferError(f"decode graph {key} would replay against moved tensors:\n{lines}")

    def moved_tensors(self, now: Mapping[str, TensorRecord] | None = None) -> list[str]:
        """`key: path` of every recorded tensor, of any graph, that moved since its capture.
        `now` stands for the present where the caller knows nothing ran since it was taken that
        could rebind a tensor (the records of the capture just made: a replay rebinds none);
        None takes a fresh snapshot."""
        if now is None:
            now = self.snapshot()
        moved = []
        for key in self.keys:
            records = self._entries[key].records
            if records is not None:
                moved += [f"{key}: {path}" for path in moved_tensors(records, now)]
        return moved

    def describe_moved(self) -> str:
        now = self.snapshot()
        lines = []
        for key in self.keys:
            records = self._entries[key].records or {}
            lines += [f"{key}: {describe_moved_tensor(p, records[p], now.get(p))}"
                      for p in moved_tensors(records, now)]
        return "\n".join(lines)

    def clear(self) -> None:
        """Release every graph; later captures use a fresh pool, never a released one."""
        for entry in self._entries.values():
            entry.graph.reset()
        self._entries.clear()
        self._entries_changed()
        self.pool = self.backend.graph_pool_handle()
