"""Explain a divergence: the first op where a graph replay departs from eager, its source line, the
input that differs and why.

`explain_divergence(step, ...)` runs `step(backend)` on an emulated backend that keeps, for every
graph it captures, the callable it captured. At each replay it first runs that callable eagerly on
the same objects, logging every op (oplog.py), puts back the memory the graph writes, then replays
the graph op by op, observing each record. The two op streams are aligned by op and source line in
order and compared within BF16 steps; the first replayed op whose result differs is explained from
what the recording knows about its inputs (causes.py). Later replays run plainly.

The eager run happens on the same objects just before the replay, so host state it advances (a
Python counter the captured code bumps) is advanced once more than without the explanation.

An eager run of the same callable shares a bug in what the host hands the graph (padding rows that
alias live memory, inputs never copied into the graph's static buffers, the graph of another key).
`checks=` are consulted before each replay for such bugs, at the level where they show: each is a
callable `(ExplainedGraph) -> Explanation | None` (engine glue, harness.repro.replay_checks).
"""

from __future__ import annotations

import bisect
import dataclasses
import os
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from harness.check.causes import (CLASSIFIERS, NEVER_WRITTEN, UPSTREAM, Cause, CauseContext, Classifier, classify,
                                  differing_arguments, paths_by_address)
from harness.check.oplog import EagerOpLog, OpEvent, output_difference, record_event, record_inputs
from harness.graphs.base import CapturedGraph, GraphBackend
from harness.graphs.emulated import EmulatedBackend, EmulatedGraph
from harness.graphs.emulator.callsite import MACHINERY_DIRS, describe_frame, user_frames
from harness.emulation import emulation_active

# Frames of this module and of the graph backends are machinery, not the user's code.
_THIS_FILE = (__file__,)
__harness_machinery__ = True  # and so for a line found from inside it (callsite.py)


def _is_machinery(frame: tuple[str, int]) -> bool:
    return frame[0] in _THIS_FILE or frame[0].startswith(MACHINERY_DIRS)


@dataclass(frozen=True)
class OpLine:
    op: str
    where: str

    def __str__(self) -> str:
        return f"{self.op}  at {self.where}"


@dataclass(frozen=True)
class Explanation:
    """The verdict. With `diverged`: the op, where it was issued (`where`, then its callers in
    `stack`), which graph and replay, how its output differs, the first input that differs and its
    `cause`, the other differing inputs, and the `before` ops that agreed (oldest first).
    `paths_not_walked`: paths under the roots nested too deep to name tensors by, skipped."""

    diverged: bool
    replays_compared: int
    ops_compared: int
    op: str = ""
    where: str = ""
    stack: tuple[str, ...] = ()
    graph: str = ""
    output: str = ""
    argument: str = ""
    cause: Cause | None = None
    other_arguments: tuple[str, ...] = ()
    before: tuple[OpLine, ...] = ()
    unmatched_ops: int = 0
    eager_failures: tuple[str, ...] = ()
    tolerance_steps: float = 2
    raised: str = ""  # the step raised this (after the divergence, if one was found): its own diagnosis
    paths_not_walked: tuple[str, ...] = ()
    # A replayed op eager never ran (its op and line): the graph runs a path the eager run of the
    # same step does not take, chosen on the host at capture (explain_against_eager fills it).
    first_unmatched: str = ""

    def __str__(self) -> str:
        counted = (f"{self.replays_compared} replays, {self.ops_compared} ops compared with eager"
                   f" ({self.unmatched_ops} recorded ops had no eager counterpart)")
        failures = [f"eager run of a captured callable failed, replay not compared: {f}"
                    for f in self.eager_failures]
        if self.raised:
            failures.append(f"the step raised {self.raised}")
        if self.paths_not_walked:
            failures.append(f"{len(self.paths_not_walked)} paths under the roots nested too deep to "
                            f"name tensors by were skipped, the first: {self.paths_not_walked[0]}")
        if not self.diverged:
            head = ("no replayed op departed from eager before the step raised" if self.raised else
                    f"no replayed op departs from eager beyond {self.tolerance_steps:g} bf16 steps")
            hint = ([] if self.raised or not self.replays_compared else
                    ["if the run still diverges, the cause is outside the replayed ops: what is copied "
                     "into the graph's inputs, padding that the eager run of the same step shares, or "
                     "which graph is replayed"])
            if self.first_unmatched and not self.raised:
                hint.append(f"or the path the graph runs: the eager run of the step never ran the "
                            f"replayed {self.first_unmatched} (a choice made on the host at capture, "
                            f"such as a layout or kernel picked for the capture batch)")
            return "\n".join([f"{head}: {counted}", *hint, *failures])
        lines = [f"first divergent op: {self.op}", f"  at {self.where}"]
        lines += [f"  called from {s}" for s in self.stack]
        lines += [f"  in {self.graph}", f"  output: {self.output}"]
        if self.cause is not None:
            lines += [f"  input `{self.argument}` differs: {self.cause.kind}", f"    {self.cause.detail}"]
        else:
            lines.append("  every input agrees with eager: the op itself computed another result "
                         "(host logic inside it frozen at capture, or nondeterminism)")
        lines += [f"  also differs: {a}" for a in self.other_arguments]
        if self.before:
            lines.append("  ops before it (all agree with eager):")
            lines += [f"    {line}" for line in self.before]
        lines += [counted, *failures]
        return "\n".join(lines)


class _Session:
    """One explanation in progress: counts, and the first divergence once found."""

    def __init__(self, steps: float, context: int, classifiers: Sequence[Classifier],
                 roots: Callable[[], Mapping[str, Any]] | None, checks: Sequence[ReplayCheck] = ()) -> None:
        self.steps = steps
        self.checks = tuple(checks)
        self.context = context
        self.classifiers = tuple(classifiers)
        self.roots = roots
        self.found: Explanation | None = None
        self.replays = 0
        self.ops = 0
        self.unmatched = 0
        self.eager_failures: list[str] = []
        self.too_deep: set[str] = set()  # paths under the roots the walks skipped

    def replay(self, graph: ExplainedGraph) -> None:
        if self.found is not None:
            graph.inner.replay()
            return
        for check in self.checks:
            finding = check(graph)
            if finding is not None:
                self.found = dataclasses.replace(finding, graph=f"{graph.label}, replay {graph.replays}",
                                                 tolerance_steps=self.steps)
                graph.inner.replay()
                return
        writes = {id(t): t for r in graph.inner.records for t in r.external_writes}
        saved = [(t, t.detach().clone()) for t in writes.values()]
        log = EagerOpLog()
        try:
            with log:
                graph.fn()
        except Exception as error:  # counted and reported: the replay still runs, uncompared
            self.eager_failures.append(f"{graph.label}: {type(error).__name__}: {error}")
            for t, copy in saved:
                t.copy_(copy)
            graph.inner.replay()
            return
        for t, copy in saved:
            t.copy_(copy)
        self.replays += 1
        _Comparison(self, graph, log.events).run()

    def result(self, raised: str = "") -> Explanation:
        if self.found is not None:
            return dataclasses.replace(self.found, replays_compared=self.replays, ops_compared=self.ops,
                                       unmatched_ops=self.unmatched,
                                       eager_failures=tuple(self.eager_failures), raised=raised,
                                       paths_not_walked=tuple(sorted(self.too_deep)))
        return Explanation(False, self.replays, self.ops, unmatched_ops=self.unmatched,
                           eager_failures=tuple(self.eager_failures), tolerance_steps=self.steps,
                           raised=raised, paths_not_walked=tuple(sorted(self.too_deep)))


class _Comparison:
    """One observed replay against the eager events of the same callable."""

    def __init__(self, session: _Session, graph: ExplainedGraph, events: list[OpEvent]) -> None:
        self.session = session
        self.graph = graph
        self.events = events
        self.positions: dict[tuple, list[int]] = {}
        for i, event in enumerate(events):
            self.positions.setdefault(event.key, []).append(i)
        self.cursor = 0
        self.pending: dict[int, tuple] = {}
        self.agreed: deque[OpLine] = deque(maxlen=session.context)
        self.written: set[int] = set()

    def run(self) -> None:
        self.graph.inner.replay_observed(self.before, self.after)

    def before(self, record) -> None:
        if self.session.found is None:
            self.pending[id(record)] = record_inputs(record)

    def after(self, record) -> None:
        inputs = self.pending.pop(id(record), None)
        if inputs is None or self.session.found is not None:
            return
        event = record_event(record, inputs)
        index = self._match(event.key)
        difference = None
        if index is None:
            self.session.unmatched += 1
        else:
            self.session.ops += 1
            difference = output_difference(self.events[index], event, self.session.steps)
        if difference is not None:
            self.session.found = self._explain(index, event, difference)
            return
        self.written.update(t.untyped_storage().data_ptr() for t in record.outputs)
        if index is not None:
            self.agreed.append(OpLine(event.op, event.where()))

    def _located(self, cause: Cause, pair, eager_index: int) -> Cause:
        """For memory no op wrote: the latest eager op before it that wrote an argument of its size
        and dtype in place, likely the one meant to fill it (and given another tensor), with its callers."""
        value = pair.eager.value
        if cause.kind != NEVER_WRITTEN or not isinstance(value, torch.Tensor):
            return cause
        # By position: OpEvents compare by their tensors, which `==` cannot judge.
        for event in reversed(self.events[:eager_index]):
            if any(o.numel() == value.numel() and o.dtype == value.dtype
                   for o in event.outputs[:event.writes]):
                frames = " <- ".join(describe_frame(f) for f in event.frames[:3] if not _is_machinery(f))
                return Cause(cause.kind, f"{cause.detail}; the latest op before it that wrote an "
                                         f"argument of that size and dtype in place: {event.op} at {frames}")
        return cause

    def _match(self, key: tuple) -> int | None:
        found = self.positions.get(key, [])
        at = bisect.bisect_left(found, self.cursor)
        if at == len(found):
            return None
        self.cursor = found[at] + 1
        return found[at]

    def _explain(self, eager_index: int, replayed: OpEvent, difference: str) -> Explanation:
        eager = self.events[eager_index]
        session = self.session
        context = CauseContext(frozenset(self.written), session.roots, self.graph.inner.first_use,
                               self.graph.paths_at_capture, too_deep=session.too_deep)
        pairs = differing_arguments(eager.inputs, replayed.inputs, session.steps)
        causes = [(pair, self._located(classify(pair, context, session.classifiers), pair, eager_index))
                  for pair in pairs]
        # A root cause before a knock-on one, an argument the op reads before one it only writes.
        causes.sort(key=lambda pc: (pc[0].replay.written, pc[1].kind == UPSTREAM))
        first = causes[0] if causes else None
        return Explanation(
            True, 0, 0, op=replayed.op, where=replayed.where(),
            stack=tuple(describe_frame(f) for f in replayed.frames[1:] if not _is_machinery(f)),
            graph=f"{self.graph.label}, replay {self.graph.replays}", output=difference,
            argument=first[0].name if first else "", cause=first[1] if first else None,
            other_arguments=tuple(f"`{p.name}`: {c.kind}" for p, c in causes[1:]),
            before=tuple(self.agreed), tolerance_steps=session.steps)


class ExplainedGraph(CapturedGraph):
    """An emulated graph with the callable it captured; its replays go through the session."""

    def __init__(self, inner: EmulatedGraph, fn: Callable[[], Any], label: str, session: _Session,
                 paths_at_capture: Mapping[int, str]) -> None:
        self.inner = inner
        self.fn = fn
        self.label = label
        self.session = session
        self.paths_at_capture = paths_at_capture  # what each address was, by path, when captured
        self.replays = 0

    @property
    def output(self) -> Any:
        return self.inner.output

    @property
    def pool(self) -> Any:
        return self.inner.pool

    def replay(self) -> None:
        self.replays += 1
        self.session.replay(self)

    def reset(self) -> None:
        self.inner.reset()


ReplayCheck = Callable[[ExplainedGraph], "Explanation | None"]


class ExplainingBackend(GraphBackend):
    """The emulated backend, keeping each capture's callable for the session's comparisons."""

    name = "emulated"

    def __init__(self, session: _Session, device: torch.device | str | None = None) -> None:
        self._inner = EmulatedBackend(device, trace=True)
        self.device = self._inner.device
        self._session = session
        self.captures = 0

    def graph_pool_handle(self) -> Any:
        return self._inner.graph_pool_handle()

    def is_capturing(self) -> bool:
        return self._inner.is_capturing()

    def synchronize(self) -> None:
        self._inner.synchronize()

    def _capture(self, fn: Callable[[], Any], *, pool: Any) -> CapturedGraph:
        self.captures += 1
        frames = [f for f in user_frames(8) if not _is_machinery(f)]
        where = f" (captured at {describe_frame(frames[0])})" if frames else ""
        paths = paths_by_address(self._session.roots, self._session.too_deep)
        inner = self._inner.capture(fn, pool=pool)
        return ExplainedGraph(inner, fn, f"graph {self.captures}{where}", self._session, paths)


def explain_divergence(step: Callable[..., Any], *inputs: Any, requests: Sequence[Any] | None = None,
                       steps: float = 2, context: int = 3,
                       roots: Callable[[], Mapping[str, Any]] | None = None,
                       classifiers: Sequence[Classifier] = (), checks: Sequence[ReplayCheck] = (),
                       device: torch.device | str | None = None) -> Explanation:
    """The first replayed op that departs from eager, and why.

    - A callable with its inputs: `step(backend, *inputs)` captures graphs on `backend` and replays
      them (any code: a test body, a runtime's step).
    - A `Runtime` with its failing requests: `step(backend)` builds the runtime on `backend`, and
      `requests=` are passed to its `generate`; the runtime is also the root tensors are named from.
    - A reproduction file: `harness.repro.explain_file` builds the step from the file.

    `device`: where the backend captures (the cpu by default, as `get_backend("emulated")`). Inside
    `harness.emulate_cuda()`, `device="cuda"` captures through torch.cuda on the emulated device,
    as the `emulated` backend does there, with the issue-order schedule (an adversarial one defers
    the eager run's ops).

    `steps`: the tolerance in bf16 steps; `context`: how many agreeing ops before it to show;
    `roots()`: objects whose tensors name addresses in the report (pointer paths); `classifiers`:
    more causes to consult before the built-in ones (causes.py); `checks`: what to look at before
    each replay, for a bug the eager run of the captured callable shares (the module's docstring).
    An error the step raises is
    reported in the explanation's `raised` (with the divergence found before it, if any).
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0 bf16 steps, got {steps}")
    if context < 0:
        raise ValueError(f"context must be >= 0 ops, got {context}")
    session = _Session(steps, context, [*classifiers, *CLASSIFIERS], roots, checks)
    backend = ExplainingBackend(session, device)
    activate_stream_work()
    try:
        result = step(backend, *inputs) if requests is None else step(backend)
        if requests is not None:
            if not hasattr(result, "generate"):
                raise _NotARuntime(f"requests= needs step(backend) to return a runtime with "
                                   f"generate(requests), got {type(result).__name__}")
            if session.roots is None:
                session.roots = lambda: {"runtime": result}
            result.generate(list(requests))
    except _NotARuntime:
        raise
    except Exception as error:  # the step's own diagnosis (a CaptureError, a freed buffer): reported
        return session.result(f"{type(error).__module__}.{type(error).__name__}: {error}")
    return session.result()


def activate_stream_work() -> None:
    """Inside emulate_cuda(): put stream tracking's dispatch mode in place now. It goes in lazily at
    the first sign of asynchrony (pinned memory), and pushed above an op log it would be popped in
    the log's place when the log's `with` ends."""
    if emulation_active() is None:
        return
    from harness.emulation.session import active_state

    tracking = getattr(active_state(), "streams_tracking", None)
    if tracking is not None:
        tracking.work.activate()


class _NotARuntime(TypeError):
    """`requests=` given with a step that builds no runtime: the caller's mistake, raised."""
