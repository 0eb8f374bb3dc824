"""The reference engine's checks before a replay, for `harness explain` (`explain_divergence`'s
`checks=`): bugs in what the host hands a graph, which an eager run of the same captured callable
shares and the op-by-op comparison therefore cannot see.

The engine decides three things at public seams right before a replay; `HostDecisions` wraps each
(around whatever is bound there, a planted fault included), notes what was decided, where the
deciding function returned and which runtime line called it, and judges it at the next replay:

- the padding (`pad_decode_batch`): a dummy row must write the pad slot, never a slot of a block a
  real row of the batch owns;
- the graph key (`DecoderGraphs.graph_key`): the key must be the one the batch asked for (its size
  and sampling variant);
- the copy into a piecewise graph's static inputs (`copy_into_static`): afterwards the buffer the
  graph reads must hold what the caller passed.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from harness.check.causes import PADDING_ALIASES, STATIC_INPUT_STALE, WRONG_GRAPH_KEY, Cause
from harness.check.explain import Explanation, ExplainedGraph
from harness.check.oplog import tensor_difference
from harness.graphs.emulator.callsite import MACHINERY_DIRS, describe_frame, describe_line

Line = tuple[str, int]


def call_noting_return(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Line | None]:
    """`fn(*args, **kwargs)` and the (file, line) at which the function it called returned."""
    caller = sys._getframe()
    returned: list[Line] = []

    def profile(frame, event, arg) -> None:
        if event == "return" and frame.f_back is caller and not returned:
            returned.append((frame.f_code.co_filename, frame.f_lineno))

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = fn(*args, **kwargs)
    finally:
        sys.setprofile(previous)
    return result, returned[0] if returned else None


def _caller(depth: int = 2) -> Line:
    frame = sys._getframe(depth)
    return frame.f_code.co_filename, frame.f_lineno


def _line(at: Line | None) -> str:
    return describe_line(*at) if at is not None else "(unknown)"


@dataclass(frozen=True)
class Padding:
    real_rows: int
    size: int
    made_at: Line | None
    called_from: Line


@dataclass(frozen=True)
class KeyChoice:
    batch_size: int
    top_k: int | None
    chosen: Any
    needed: Any
    made_at: Line | None
    called_from: Line


@dataclass(frozen=True)
class StaleInput:
    name: str
    static: torch.Tensor
    passed: torch.Tensor
    difference: str
    made_at: Line | None
    called_from: Line


def _first_record_reading(graph: ExplainedGraph, start: int, end: int):
    """The first recorded op of `graph` with a tensor argument overlapping [start, end) (addresses)."""
    for record in graph.inner.records:
        for argument in record.arguments:
            value = argument.value
            if isinstance(value, torch.Tensor) and value.numel():
                low, high = _span(value)
                if low < end and start < high:
                    return record
    return None


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + max(t.numel(), 1) * t.element_size()


def _where(record) -> tuple[str, tuple[str, ...]]:
    """Where a recorded op was issued, and its callers outside the graph backends."""
    if record is None or not record.frames:
        return "", ()
    callers = tuple(describe_frame(f) for f in record.frames[1:] if not f[0].startswith(MACHINERY_DIRS))
    return describe_frame(record.frames[0]), callers


def _short(t: torch.Tensor) -> str:
    values = t.flatten()[:6].tolist()
    more = ", ..." if t.numel() > 6 else ""
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} [{', '.join(map(str, values))}{more}]"


class HostDecisions:
    """Notes the engine's padding, key and static-input copies between replays (`planted()`), and
    judges them before each replay (`check`, an `explain_divergence` check)."""

    def __init__(self, engines: list[Any]) -> None:
        self.engines = engines
        self.padding: Padding | None = None
        self.key: KeyChoice | None = None
        self.stale: list[StaleInput] = []

    @contextlib.contextmanager
    def planted(self) -> Iterator[None]:
        from harness.faults.patching import replace_function, replace_method
        from harness.runtime.decode import runner as decode_runner
        from harness.runtime.decode.decoder_graphs import DecoderGraphs
        from harness.runtime.piecewise import runner as piecewise_runner

        with replace_function(decode_runner, "pad_decode_batch", self._noting_padding), \
                replace_method(DecoderGraphs, "graph_key", self._noting_key), \
                replace_function(piecewise_runner, "copy_into_static", self._noting_copy):
            yield

    # --- noting -------------------------------------------------------------------------------

    def _noting_padding(self, pad: Callable[..., Any]) -> Callable[..., Any]:
        def pad_decode_batch(spans, size):
            padded, made_at = call_noting_return(pad, spans, size)
            self.padding = Padding(len(spans), size, made_at, _caller())
            return padded
        return pad_decode_batch

    def _noting_key(self, make_key: Callable[..., Any]) -> Callable[..., Any]:
        from harness.runtime.decode.runner import DecodeGraphKey, sampling_variant

        def graph_key(graphs, batch_size, top_k):
            key, made_at = call_noting_return(make_key, graphs, batch_size, top_k)
            needed = DecodeGraphKey.of(batch_size, sampling_variant(top_k))
            self.key = KeyChoice(batch_size, top_k, key, needed, made_at, _caller())
            return key
        return graph_key

    def _noting_copy(self, copy: Callable[..., Any]) -> Callable[..., Any]:
        def copy_into_static(static, new, *, name):
            result, made_at = call_noting_return(copy, static, new, name=name)
            difference = tensor_difference(new, static, 0)
            if difference is not None:
                self.stale.append(StaleInput(name, static, new.detach().clone(), difference, made_at, _caller()))
            return result
        return copy_into_static

    # --- judging ------------------------------------------------------------------------------

    def check(self, graph: ExplainedGraph) -> Explanation | None:
        key, padding, stale = self.key, self.padding, self.stale
        self.key, self.padding, self.stale = None, None, []
        if key is not None and key.chosen != key.needed:
            return self._wrong_key(key)
        if padding is not None and padding.size > padding.real_rows and self.engines:
            found = self._aliasing_padding(graph, padding)
            if found is not None:
                return found
        if stale:
            return self._stale_input(graph, stale[0], stale[1:])
        return None

    def _wrong_key(self, key: KeyChoice) -> Explanation:
        captured = self.engines[-1].decode_graphs.keys if self.engines else []
        asked = "logits (greedy)" if key.top_k is None else f"top-{key.top_k} logprobs"
        detail = (f"the host chose {key.chosen} for a batch of {key.batch_size} rows asking for {asked}, "
                  f"which needs {key.needed} (captured: {', '.join(map(str, captured))}); the key was "
                  f"made at {_line(key.made_at)}, called from {_line(key.called_from)}")
        return Explanation(True, 0, 0, op="DecoderGraphs.graph_key (host)", where=_line(key.made_at),
                           stack=(_line(key.called_from),),
                           output=f"replays the graph of {key.chosen}; the batch needs {key.needed}",
                           argument="graph key", cause=Cause(WRONG_GRAPH_KEY, detail))

    def _aliasing_padding(self, graph: ExplainedGraph, padding: Padding) -> Explanation | None:
        metadata = self.engines[-1].metadata
        n, size, block = padding.real_rows, padding.size, metadata.block_size
        tables, seq_lens = metadata.block_tables[:n].tolist(), metadata.seq_lens[:n].tolist()
        owner = {b: row for row, (table, length) in enumerate(zip(tables, seq_lens))
                 for b in table[:-(-length // block)] if b != metadata.pad_block}
        dummy_slots = metadata.slot_mapping[n:size].tolist()
        hits = [(n + i, slot, owner[slot // block]) for i, slot in enumerate(dummy_slots)
                if slot != metadata.pad_slot and slot // block in owner]
        if not hits:
            return None
        rows = sorted({row for _, _, row in hits})
        record = _first_record_reading(graph, *_span(metadata.slot_mapping[n:size]))
        detail = (f"dummy rows {n}..{size - 1} of a batch of {n} sequences padded to {size} write KV slots "
                  f"{[slot for _, slot, _ in hits]} (`metadata.slot_mapping[{n}:{size}]`), in blocks of "
                  f"live row(s) {rows} (`metadata.block_tables[{rows[0]}]`: "
                  f"{tables[rows[0]][:-(-seq_lens[rows[0]] // block)]}), not the pad slot "
                  f"{metadata.pad_slot}; the padding was made at {_line(padding.made_at)}, called from "
                  f"{_line(padding.called_from)}")
        return Explanation(True, 0, 0, op=record.op if record else "(no recorded op reads them)",
                           where=_where(record)[0], stack=_where(record)[1],
                           output=f"the K/V of padding rows lands in blocks of live row(s) {rows}",
                           argument="metadata.slot_mapping", cause=Cause(PADDING_ALIASES, detail))

    def _stale_input(self, graph: ExplainedGraph, first: StaleInput, others: list[StaleInput]) -> Explanation:
        storage = first.static.untyped_storage()
        record = _first_record_reading(graph, storage.data_ptr(), storage.data_ptr() + storage.nbytes())
        detail = (f"graph reads {_short(first.static)}, caller passed {_short(first.passed)} "
                  f"({first.difference}); the copy into the static buffer should happen at "
                  f"{_line(first.called_from)}, and the function called there returned at "
                  f"{_line(first.made_at)} without copying")
        return Explanation(True, 0, 0, op=record.op if record else "(no recorded op reads it)",
                           where=_where(record)[0], stack=_where(record)[1],
                           output="the graph computes on the inputs of its capture (or of the last copy)",
                           argument=first.name, cause=Cause(STATIC_INPUT_STALE, detail),
                           other_arguments=tuple(f"`{s.name}`: {STATIC_INPUT_STALE}" for s in others))
