"""Explain code that captures its own graphs with `torch.cuda.CUDAGraph` / `torch.cuda.graph`
(unmodified code written for CUDA, on the emulated device of `harness.emulate_cuda()`).

Such code hands the harness no callable to re-run eagerly at each replay, so the reference is the
code's own eager path: `explain_against_eager(graphed, eager)` runs `eager()` logging every op, then
`graphed()` logging every op outside its graphs and every replayed op from the graph's recording
(the emulated CUDAGraph's `keep_trace`, `observe_replays`). What ran before the latest capture ended
(warmups, the capture's own Python) is not compared: the graphed run is compared from its last
capture on, so the step must capture its graphs before it serves. The op streams are aligned by op
and source line in order; the first op whose result differs beyond the BF16-step tolerance is named
with its line and the input that differs. Addresses of two runs are unrelated, so a buffer rebound
since capture is told by its values: the replay reads its capture-time buffer while a tensor under
`roots()` holds what eager reads.

Padding is not a cause. A graph captured for the largest batch computes on more rows, and its
static buffers are sized for the longest table ([max_bs, max_blocks] where eager passes
[batch, blocks in use]): wherever the graphed tensor is larger than eager's in a dimension (same
number of dimensions), only eager's leading slice is compared, so the padded shape itself is
expected. What the padding rows do is still judged where it shows: an op whose output departs from
eager's on the real rows while every input agrees on them is blamed on its inputs' padding rows,
and a read of memory a replayed op wrote where eager's op wrote nothing (a padding row's write into
a live slot) is blamed on that write, named with its line. Eager work of the graphed run that reads
memory a replay wrote, and departs, is told which replay last wrote it: a graph's static output
held across its next replay.

Values within the tolerance are not a cause either: an op whose float output agrees with eager's
only within the BF16-step tolerance (a 4-row and a 3-row matmul round differently) taints where it
wrote, and an exact-dtype result (integer or boolean) read from tainted memory that differs (the
bits of a logit turned into ranking keys) agrees and taints in turn: ranking values that agree
within the tolerance may order them differently.

The comparison needs every replay observed in issue order: under `emulate_cuda(schedule=
"adversarial")` replays are deferred to the stream's turn and it refuses (`ReplaysNotObserved`),
and a replay issued but never observed (an observer of the device that runs replays itself) is
refused after the run. On a GPU (the graph sanitizer) the same comparison runs with real tensors;
the logs' copies are in host memory there too (oplog.py).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

import torch

from harness import torch_internals
from harness.check.causes import (BUFFER_REBOUND, CONTENTS_CHANGED, PADDING_ALIASES, ArgumentPair, Cause,
                                  CauseContext, classify, host_value, path_at, pool_memory, tensors_under,
                                  uninitialized, unwritten_pool, upstream)
from harness.check.explain import Explanation, OpLine, _is_machinery, activate_stream_work
from harness.check.oplog import (EagerOpLog, OpEvent, Value, host_copy, record_event, record_inputs,
                                 tensor_difference)
from harness.graphs.emulator.callsite import describe_frame, traceback_callsite
from harness.graphs.emulator.trace import Origin

__harness_machinery__ = True  # a line found from inside the observed replays is the program's


class ReplaysNotObserved(RuntimeError):
    """explain_against_eager cannot see the graphed run's replays op by op, so it cannot compare them."""


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
        self.first_unmatched = ""  # the first replayed op with no eager counterpart, and its line
        self.agreed: deque[OpLine] = deque(maxlen=context)
        self.found: Explanation | None = None
        self.too_deep: set[str] = set()  # paths under the roots the walks skipped
        # Storages of the graphed run holding values that agree with eager's only within the
        # tolerance (the module's docstring).
        self.approximate: set[int] = set()
        # Storages of the graphed run that one of its replayed ops wrote where eager's op wrote
        # nothing (the graph's padding rows), with that op: judged where a real row reads them.
        self.graph_only: dict[int, OpLine] = {}
        # Storages the replays wrote, with the last replay that wrote each ("graph 1, replay 2").
        self.replay_writes: dict[int, str] = {}

    def feed(self, event: OpEvent, replayed: _Replayed | None) -> None:
        if self.found is not None:
            return
        with torch_internals.DisableTorchFunction():  # host copies, compared as the host sees them
            self._feed(event, replayed)

    def _feed(self, event: OpEvent, replayed: _Replayed | None) -> None:
        found = self.positions.get(event.key, [])
        at = bisect.bisect_left(found, self.cursor)
        if at == len(found):
            self.unmatched += 1
            if replayed is not None and not self.first_unmatched:
                self.first_unmatched = f"{event.op} at {event.where()}"
            return
        self.cursor = found[at] + 1
        self.compared += 1
        reference = self.eager[found[at]]
        difference = _output_difference(reference, event, self.steps)
        if difference is not None and _exact_results_of_approximate(reference, event, self.steps,
                                                                     self.approximate):
            difference = None
        if difference is None:
            if not _outputs_equal(reference, event):
                self.approximate.update(event.output_storages)
            else:  # written exactly now (or memory freed and made again at that address)
                self.approximate.difference_update(event.output_storages)
            self.agreed.append(OpLine(event.op, event.where()))
            for storage in _graph_only_writes(reference, event):
                self.graph_only[storage] = OpLine(event.op, event.where())
            return
        context = CauseContext(replayed.written if replayed else frozenset(), self.roots,
                               replayed.first_use if replayed else (lambda address: ""),
                               too_deep=self.too_deep)
        classifiers = (self._written_by_padding,) + (() if replayed else (self._rewritten_by_a_replay,))
        classifiers += CLASSIFIERS
        pairs = [(p, classify(p, context, classifiers)) for p in _differing(reference, event, self.steps)]
        if not pairs:
            pairs = _padding_rows(reference, event)
        first = pairs[0] if pairs else None
        self.found = Explanation(
            True, 0, 0, op=event.op, where=event.where(),
            stack=tuple(describe_frame(f) for f in event.frames[1:] if not _is_machinery(f)),
            graph=replayed.graph if replayed else "not a replayed op: eager work of the graphed run",
            output=difference, argument=first[0].name if first else "",
            cause=first[1] if first else None,
            other_arguments=tuple(f"`{p.name}`: {c.kind}" for p, c in pairs[1:]),
            before=tuple(self.agreed), tolerance_steps=self.steps)

    def _written_by_padding(self, pair: ArgumentPair, context: CauseContext) -> Cause | None:
        line = self.graph_only.get(pair.replay.storage) if pair.replay.storage is not None else None
        if line is None:
            return None
        return Cause(PADDING_ALIASES,
                     f"`{pair.name}` holds what the replayed {line.op} at {line.where} wrote where "
                     f"eager's wrote nothing, rows only the graph computes (its padding): padding "
                     f"rows must write only memory that no real row reads, such as a sink slot "
                     f"({pair.difference})")

    def _rewritten_by_a_replay(self, pair: ArgumentPair, context: CauseContext) -> Cause | None:
        """Eager work of the graphed run reading memory a replay wrote: a graph's output, held."""
        label = self.replay_writes.get(pair.replay.storage) if pair.replay.storage is not None else None
        if label is None:
            return None
        return Cause(CONTENTS_CHANGED,
                     f"`{pair.name}` is memory the graph writes (its static output, or a buffer of its "
                     f"pool), last written by {label}: it holds that replay's values where eager "
                     f"reads its own result. A graph rewrites its outputs at every replay: a result "
                     f"held across the next replay must be cloned before it ({pair.difference})")

    def result(self, replays: int, raised: str) -> Explanation:
        if self.found is not None:
            return replace(self.found, replays_compared=replays, ops_compared=self.compared,
                           unmatched_ops=self.unmatched, raised=raised,
                           paths_not_walked=tuple(sorted(self.too_deep)))
        return Explanation(False, replays, self.compared, unmatched_ops=self.unmatched,
                           tolerance_steps=self.steps, raised=raised,
                           paths_not_walked=tuple(sorted(self.too_deep)),
                           first_unmatched=self.first_unmatched)


class _GraphedRun:
    """An observer of the emulated device: traces every capture, and feeds the matcher the ops the
    graphed run logs outside its graphs and each replayed op from the graph's records."""

    def __init__(self, log: EagerOpLog, matcher: _Matcher) -> None:
        self.log = log
        self.matcher = matcher
        self.fed = 0  # log events already fed
        self.labels: dict[int, str] = {}
        self.replays = 0
        self.issued = 0  # replays of its graphs the run issued
        self.skipped = 0  # replays after the divergence was found, run plainly

    def on_replay(self, graph, stream) -> None:
        if id(graph) in self.labels:
            self.issued += 1

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
            self.skipped += 1
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
            storages = [t.untyped_storage().data_ptr() for t in record.outputs]
            written.update(storages)
            self.matcher.replay_writes.update(dict.fromkeys(storages, label))

        self.log.paused = True
        try:
            recording.replay_observed(before, after)
        finally:
            self.log.paused = False


def _unpadded(expected: Any, actual: Any) -> Any:
    """`actual` cut to `expected`'s leading slice where it is larger in some dimension and smaller
    in none (a graph's padding: more rows, a wider static table)."""
    if (isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor) and expected.dim() > 0
            and expected.dim() == actual.dim() and actual.shape != expected.shape
            and all(a >= e for a, e in zip(actual.shape, expected.shape))):
        return actual[tuple(slice(0, e) for e in expected.shape)]
    return actual


def _padded(expected: Any, actual: Any) -> bool:
    return _unpadded(expected, actual) is not actual


_EXACT = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _outputs_equal(eager: OpEvent, graphed: OpEvent) -> bool:
    """Whether the graphed op's outputs (on eager's slice) equal eager's bit for bit, NaNs alike."""
    for e, a in zip(eager.outputs, _beyond_eager_writes(eager, graphed)):
        a = _unpadded(e, a)
        if not isinstance(e, torch.Tensor) or not isinstance(a, torch.Tensor) or e.shape != a.shape:
            continue
        if not bool(((e == a) | (e.isnan() & a.isnan()) if e.dtype.is_floating_point else (e == a)).all()):
            return False
    return True


def _exact_results_of_approximate(eager: OpEvent, graphed: OpEvent, steps: float,
                                  approximate: set[int]) -> bool:
    """Whether every output that departs from eager's is of an exact dtype and the op read memory
    holding values that agree only within the tolerance (the module's docstring)."""
    if not any(v.storage in approximate for v in graphed.inputs if v.storage is not None):
        return False
    for e, a in zip(eager.outputs, _beyond_eager_writes(eager, graphed)):
        if _difference(e, a, steps) is not None and not (
                isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor) and e.dtype in _EXACT
                and e.dtype == a.dtype and e.shape == _unpadded(e, a).shape):
            return False
    return True


def _padding_rows(eager: OpEvent, graphed: OpEvent) -> list[tuple[ArgumentPair, Cause]]:
    """The inputs that agree with eager only on eager's slice: their padding is what can have
    changed the op's output on the real rows."""
    by_name = {v.name: v for v in eager.inputs}
    found = []
    for value in graphed.inputs:
        other = by_name.get(value.name)
        if other is None or not _padded(other.value, value.value):
            continue
        shape, eager_shape = tuple(value.value.shape), tuple(other.value.shape)
        extra = value.value[eager_shape[0]:] if shape[0] > eager_shape[0] else None
        rows = (f"; its padding rows [{eager_shape[0]}:{shape[0]}] hold {_short_values(extra)}"
                if extra is not None else "")
        found.append((ArgumentPair(value.name, other, value, f"shape {shape} where eager has {eager_shape}"),
                      Cause(PADDING_ALIASES,
                            f"`{value.name}` agrees with eager on eager's {eager_shape} slice of the graph's "
                            f"{shape}{rows}: every input agrees on the real rows, so what the padding "
                            f"made the op do is what departs (padding rows must touch only memory that "
                            f"no real row reads, such as a sink slot)")))
    return found


def _short_values(t: torch.Tensor) -> str:
    text = str(t.flatten()[:8].tolist())
    return text if t.numel() <= 8 else text[:-1] + ", ...]"


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


def _graph_only_writes(eager: OpEvent, graphed: OpEvent) -> list[int]:
    """Storages of arguments the graphed op wrote, with other values, where eager's op left them
    unchanged (what `_beyond_eager_writes` leaves out of the op's own comparison)."""
    found = []
    eager_before = {v.name: v.value for v in eager.inputs}
    names = [v.name for v in graphed.inputs if v.written]
    for i, name in enumerate(names[:min(len(graphed.outputs), len(eager.outputs), len(graphed.output_storages))]):
        before, after, written = eager_before.get(name), eager.outputs[i], graphed.outputs[i]
        tensors = (before, after, written)
        if not all(isinstance(t, torch.Tensor) for t in tensors) or len({t.shape for t in tensors}) != 1 \
                or len({t.dtype for t in tensors}) != 1:
            continue
        differs = written != after
        if after.dtype.is_floating_point:
            differs &= ~(written.isnan() & after.isnan())
        if bool(((before == after) & differs).any()):
            found.append(graphed.output_storages[i])
    return found


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
                host_copy(flat[offset: offset + values.numel()]).reshape(values.shape), values):
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
    names tensors of the graphed run by path. An error either run raises is reported in `raised`,
    with its type, message and the program's line. `ReplaysNotObserved` where the replays cannot be
    observed (the adversarial schedule)."""
    if steps < 0:
        raise ValueError(f"steps must be >= 0 bf16 steps, got {steps}")
    if context < 0:
        raise ValueError(f"context must be >= 0 ops, got {context}")
    from harness.emulation import emulate_cuda
    from harness.emulation.session import active_state, emulation_active

    if emulation_active() is None:
        with emulate_cuda():
            return explain_against_eager(graphed, eager, steps=steps, context=context, roots=roots)
    _refuse_deferred_replays(active_state())
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
    if run.issued > run.replays + run.skipped and not raised:
        raise ReplaysNotObserved(
            f"explain_against_eager observed {run.replays} of the {run.issued} graph replays the "
            f"graphed run issued: an observer of the device ran the others itself, so they cannot be "
            f"compared with eager; explain with the emulated device alone (emulate_cuda() with "
            f"schedule='issue_order')")
    return matcher.result(run.replays, raised)


def _refuse_deferred_replays(state) -> None:
    name = getattr(state, "schedule", "issue_order")
    if name != "issue_order":
        raise ReplaysNotObserved(
            f"explain_against_eager cannot observe replays under emulate_cuda(schedule={name!r}): "
            f"that schedule runs each replay at its stream's turn, after the op log moved on; "
            f"accepted: schedule='issue_order' (the default; in a pytest session, drop "
            f"--cuda-schedule {name} or pass --cuda-schedule issue_order). Races under the "
            f"adversarial schedule are reported by the schedule itself")


def _named(error: Exception) -> str:
    """The error's type, its message (or that it has none) and the program's line that raised it."""
    message = str(error) or "(no message)"
    where = traceback_callsite(error.__traceback__)
    return (f"{type(error).__module__}.{type(error).__name__}: {message}"
            + (f"\n  raised at {where}" if where else ""))
