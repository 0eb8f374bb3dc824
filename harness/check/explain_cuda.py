"""Explain code that captures its own graphs with `torch.cuda.CUDAGraph` / `torch.cuda.graph`
(unmodified code written for CUDA, on the emulated device of `harness.emulate_cuda()`).

Such code hands the harness no callable to re-run eagerly at each replay, so the reference is the
code's own eager path: `explain_against_eager(graphed, eager)` runs `eager()` logging every op, then
`graphed()` logging every op outside its graphs and every replayed op from the graph's recording
(the emulated CUDAGraph's `keep_trace`, `observe_replays`). What ran before the latest capture ended
(warmups, the capture's own Python) is not compared: the graphed run is compared from its last
capture on, so the step must capture its graphs before it serves. The op streams are aligned by op
and source line in order; the first op whose result differs beyond the BF16-step tolerance is named
with its line and the input that differs. Rows beyond eager's at the tail of a leading dimension are
a graph's padding and are not compared. Addresses of two runs are unrelated, so a buffer rebound
since capture is told by its values: the replay reads its capture-time buffer while a tensor under
`roots()` holds what eager reads.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

import torch

from harness import torch_internals
from harness.check.causes import (BUFFER_REBOUND, CONTENTS_CHANGED, ArgumentPair, Cause, CauseContext,
                                  classify, host_value, path_at, pool_memory, tensors_under,
                                  uninitialized, unwritten_pool, upstream)
from harness.check.explain import Explanation, OpLine, _is_machinery, activate_stream_work
from harness.check.oplog import EagerOpLog, OpEvent, Value, record_event, record_inputs, tensor_difference
from harness.graphs.emulator.callsite import describe_frame
from harness.graphs.emulator.trace import Origin


@dataclass(frozen=True)
class _Replayed:
    graph: str
    first_use: Callable[[int], str]
    written: frozenset[int]  # storages the replay wrote before this op


class _Matcher:
    """The graphed run's events, each matched to the next eager event of the same op and line, and
    compared as it comes (so that the roots name tensors as they are at that point of the run)."""

    def __init__(self, eager: list[OpEvent], steps: float, context: int, roots) -> None:
        self.eager = eager
        self.steps = steps
        self.roots = roots
        self.positions: dict[tuple, list[int]] = {}
        for i, event in enumerate(eager):
            self.positions.setdefault(event.key, []).append(i)
        self.cursor = 0
        self.compared = 0
        self.unmatched = 0
        self.agreed: deque[OpLine] = deque(maxlen=context)
        self.found: Explanation | None = None
        self.too_deep: set[str] = set()  # paths under the roots the walks skipped

    def feed(self, event: OpEvent, replayed: _Replayed | None) -> None:
        if self.found is not None:
            return
        found = self.positions.get(event.key, [])
        at = bisect.bisect_left(found, self.cursor)
        if at == len(found):
            self.unmatched += 1
            return
        self.cursor = found[at] + 1
        self.compared += 1
        reference = self.eager[found[at]]
        difference = _output_difference(reference, event, self.steps)
        if difference is None:
            self.agreed.append(OpLine(event.op, event.where()))
            return
        context = CauseContext(replayed.written if replayed else frozenset(), self.roots,
                               replayed.first_use if replayed else (lambda address: ""),
                               too_deep=self.too_deep)
        pairs = [(p, classify(p, context, CLASSIFIERS)) for p in _differing(reference, event, self.steps)]
        first = pairs[0] if pairs else None
        self.found = Explanation(
            True, 0, 0, op=event.op, where=event.where(),
            stack=tuple(describe_frame(f) for f in event.frames[1:] if not _is_machinery(f)),
            graph=replayed.graph if replayed else "not a replayed op: eager work of the graphed run",
            output=difference, argument=first[0].name if first else "",
            cause=first[1] if first else None,
            other_arguments=tuple(f"`{p.name}`: {c.kind}" for p, c in pairs[1:]),
            before=tuple(self.agreed), tolerance_steps=self.steps)

    def result(self, replays: int, raised: str) -> Explanation:
        if self.found is not None:
            return replace(self.found, replays_compared=replays, ops_compared=self.compared,
                           unmatched_ops=self.unmatched, raised=raised,
                           paths_not_walked=tuple(sorted(self.too_deep)))
        return Explanation(False, replays, self.compared, unmatched_ops=self.unmatched,
                           tolerance_steps=self.steps, raised=raised,
                           paths_not_walked=tuple(sorted(self.too_deep)))


class _GraphedRun:
    """An observer of the emulated device: traces every capture, and feeds the matcher the ops the
    graphed run logs outside its graphs and each replayed op from the graph's records."""

    def __init__(self, log: EagerOpLog, matcher: _Matcher) -> None:
        self.log = log
        self.matcher = matcher
        self.fed = 0  # log events already fed
        self.labels: dict[int, str] = {}
        self.replays = 0

    def on_capture_begin(self, graph, stream, mode) -> None:
        graph.keep_trace()

    def on_capture_end(self, graph, aborted: bool) -> None:
        if aborted:
            return
        del self.log.events[self.fed:]  # warmups and the capture's own Python: not compared
        self.labels[id(graph)] = f"graph {len(self.labels) + 1}"
        graph.observe_replays(lambda recording: self._replay(graph, recording))

    def flush(self) -> None:
        for event in self.log.events[self.fed:]:
            self.matcher.feed(event, None)
        self.fed = len(self.log.events)

    def _replay(self, graph, recording) -> None:
        self.flush()
        if self.matcher.found is not None:
            recording.replay()
            return
        self.replays += 1
        label = f"{self.labels.get(id(graph), 'a graph')}, replay {self.replays}"
        written: set[int] = set()
        pending: dict[int, tuple[Value, ...]] = {}

        def before(record) -> None:
            pending[id(record)] = record_inputs(record)

        def after(record) -> None:
            replayed = _Replayed(label, recording.first_use, frozenset(written))
            self.matcher.feed(record_event(record, pending.pop(id(record))), replayed)
            written.update(t.untyped_storage().data_ptr() for t in record.outputs)

        self.log.paused = True
        try:
            recording.replay_observed(before, after)
        finally:
            self.log.paused = False


def _unpadded(expected: Any, actual: Any) -> Any:
    """`actual` cut to `expected`'s rows where it only has more of them (a graph's padding rows)."""
    if (isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor) and expected.dim() > 0
            and expected.dim() == actual.dim() and actual.shape[0] > expected.shape[0]
            and actual.shape[1:] == expected.shape[1:]):
        return actual[: expected.shape[0]]
    return actual


def _difference(expected: Any, actual: Any, steps: float) -> str | None:
    return tensor_difference(expected, _unpadded(expected, actual), steps)


def _beyond_eager_writes(eager: OpEvent, graphed: OpEvent) -> list[Any]:
    """The graphed op's outputs, where an argument it writes in place takes eager's values wherever
    eager's op left it unchanged: only what eager's op wrote is judged here. What only the graph
    writes (its padding rows' writes into a sink slot) is judged where something reads it."""
    outputs = list(graphed.outputs)
    eager_before = {v.name: v.value for v in eager.inputs}
    for i, name in enumerate(v.name for v in graphed.inputs if v.written):
        if i >= min(len(outputs), len(eager.outputs)):
            break
        before, after, written = eager_before.get(name), eager.outputs[i], outputs[i]
        tensors = (before, after, written)
        if all(isinstance(t, torch.Tensor) for t in tensors) and len({t.shape for t in tensors}) == 1 \
                and len({t.dtype for t in tensors}) == 1:
            outputs[i] = torch.where(before == after, after, written)
    return outputs


def _output_difference(eager: OpEvent, graphed: OpEvent, steps: float) -> str | None:
    if len(eager.outputs) != len(graphed.outputs):
        return f"{len(graphed.outputs)} outputs where eager has {len(eager.outputs)}"
    for i, (e, a) in enumerate(zip(eager.outputs, _beyond_eager_writes(eager, graphed))):
        found = _difference(e, a, steps)
        if found:
            return found if len(eager.outputs) == 1 else f"output {i}: {found}"
    return None


def _differing(eager: OpEvent, graphed: OpEvent, steps: float) -> list[ArgumentPair]:
    by_name = {v.name: v for v in eager.inputs}
    pairs = []
    for value in graphed.inputs:
        other = by_name.get(value.name)
        if other is None or (value.written and other.allocated_at):
            continue
        difference = _difference(other.value, value.value, steps)
        if difference:
            unpadded = replace(value, value=_unpadded(other.value, value.value))
            pairs.append(ArgumentPair(value.name, other, unpadded, difference))
    return sorted(pairs, key=lambda pair: pair.replay.written)


def _holder_of(values: torch.Tensor, context: CauseContext, replay: Value) -> str:
    """The path of a tensor under the roots, other than the graph's buffer, holding `values` at the
    offset the graph reads its own buffer at."""
    if replay.address is None or replay.storage is None:
        return ""
    offset = (replay.address - replay.storage) // values.element_size()
    for path, t in tensors_under(context):
        if t.dtype != values.dtype or t.untyped_storage().data_ptr() == replay.storage:
            continue
        flat = t.detach().reshape(-1)
        if flat.numel() >= offset + values.numel() and torch.equal(
                flat[offset: offset + values.numel()].reshape(values.shape), values):
            return f"`{path}`"
    return ""


def _rebound_by_values(pair: ArgumentPair, context: CauseContext) -> Cause | None:
    eager = pair.eager.value
    if pair.replay.origin is not Origin.EXTERNAL or not isinstance(eager, torch.Tensor):
        return None
    holder = _holder_of(eager, context, pair.replay)
    if not holder:
        return None
    now = path_at(context, pair.replay.address)
    first = context.first_use(pair.replay.address or 0)
    reads = f"the graph reads `{pair.name}` in its capture-time buffer at {pair.replay.address:#x}"
    reads += f" (now {now})" if now else ""
    reads += f", first used at {first}" if first else ""
    return Cause(BUFFER_REBOUND, f"{reads}; the values eager reads are in {holder}, another buffer: "
                                 f"rebound since capture instead of copied into ({pair.difference})")


def _other_contents(pair: ArgumentPair, context: CauseContext) -> Cause | None:
    if pair.replay.origin is not Origin.EXTERNAL:
        return None
    now = path_at(context, pair.replay.address)
    return Cause(CONTENTS_CHANGED, f"`{pair.name}` is read at its capture-time address "
                                   f"({now or hex(pair.replay.address or 0)}), which holds other values "
                                   f"than eager reads: {pair.difference}")


CLASSIFIERS = (uninitialized, host_value, _rebound_by_values, unwritten_pool, pool_memory,
               _other_contents, upstream)


def explain_against_eager(graphed: Callable[[], Any], eager: Callable[[], Any], *, steps: float = 2,
                          context: int = 3, roots: Callable[[], Mapping[str, Any]] | None = None) -> Explanation:
    """The first op of `graphed()` (code that captures and replays torch.cuda graphs) whose result
    departs from the same op of `eager()` (the same work without graphs), and why (the module's
    docstring). Runs inside the active `harness.emulate_cuda()`, or in one of its own. `roots()`
    names tensors of the graphed run by path. An error either run raises is reported in `raised`."""
    if steps < 0:
        raise ValueError(f"steps must be >= 0 bf16 steps, got {steps}")
    if context < 0:
        raise ValueError(f"context must be >= 0 ops, got {context}")
    from harness.emulation import emulate_cuda
    from harness.emulation.session import active_state, emulation_active

    if emulation_active() is None:
        with emulate_cuda():
            return explain_against_eager(graphed, eager, steps=steps, context=context, roots=roots)
    activate_stream_work()
    reference, log = EagerOpLog(), EagerOpLog()
    raised = ""
    try:
        with reference:
            eager()
    except Exception as error:
        return Explanation(False, 0, 0, tolerance_steps=steps, raised=f"the eager run raised {_named(error)}")
    # The logs' copies are plain cpu tensors, some marked device memory: compared as the host sees them.
    with torch_internals.DisableTorchFunction():
        matcher = _Matcher(reference.events, steps, context, roots)
    run = _GraphedRun(log, matcher)
    try:
        with active_state().observe(run), log:
            graphed()
    except Exception as error:  # the run's own diagnosis (a freed buffer, a CaptureError): reported
        raised = _named(error)
    with torch_internals.DisableTorchFunction():
        run.flush()
    return matcher.result(run.replays, raised)


def _named(error: Exception) -> str:
    return f"{type(error).__module__}.{type(error).__name__}: {error}"
