"""Why an op of a replay read another input than eager: each classifier looks at one argument of the
first divergent op, as the replay and the eager run saw it, and names the cause or passes.

`CLASSIFIERS` runs in order; the first that names a cause wins. A source of causes this module does
not know (the adversarial stream schedule's races) adds its classifier in front through
`explain_divergence(..., classifiers=...)`: a callable `(ArgumentPair, CauseContext) -> Cause | None`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from harness.check.oplog import Value, tensor_difference
from harness.graphs.emulator.pool import is_poisoned
from harness.graphs.emulator.trace import Origin
from harness.graphs.pointers import TensorRecord, public_tensor_refs

HOST_VALUE_FROZEN = "host value frozen at capture"
BUFFER_REBOUND = "buffer rebound since capture"
CONTENTS_CHANGED = "captured address whose contents changed since capture"
POOL_OVERWRITTEN = "pool memory overwritten by another graph"
NEVER_WRITTEN = "graph memory never written by the graph"
UPSTREAM = "computed differently by an earlier op of the replay"
RACE = "a race under the adversarial schedule"
# Found before a replay, in what the host hands the graph (explain.py's `checks=`):
PADDING_ALIASES = "padding rows alias live memory"
STATIC_INPUT_STALE = "static input not refreshed since capture/last copy"
WRONG_GRAPH_KEY = "graph chosen for another key"


@dataclass(frozen=True)
class Cause:
    kind: str     # one of the constants above (or a classifier's own)
    detail: str


@dataclass(frozen=True)
class ArgumentPair:
    name: str
    eager: Value
    replay: Value
    difference: str  # how the replay's value departs from eager's


@dataclass(frozen=True)
class CauseContext:
    """What the comparison knows beyond the op: `written_by_graph` holds the addresses this replay
    wrote before the op (graph memory another graph can take over); `roots` name tensors by path
    now, `paths_at_capture` (a pointer snapshot of the roots when the graph was captured) then.
    `too_deep` collects the paths under the roots that walks skipped, for the explanation to report."""

    written_by_graph: frozenset[int]
    roots: Callable[[], Mapping[str, Any]] | None
    first_use: Callable[[int], str]  # the capture's first use of an external address, or ""
    paths_at_capture: Mapping[int, str] = field(default_factory=dict)  # address -> path
    too_deep: set[str] = field(default_factory=set)


Classifier = Callable[[ArgumentPair, CauseContext], "Cause | None"]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def uninitialized(pair: ArgumentPair, context: CauseContext) -> Cause | None:
    if not pair.eager.allocated_at:
        return None
    return Cause(NEVER_WRITTEN,
                 f"`{pair.name}` was allocated by an `empty` at {pair.eager.allocated_at} and no op "
                 f"wrote it before this one read it, in the graph and eagerly alike: the op meant "
                 f"to fill it wrote another tensor (both runs read leftover memory)")


def host_value(pair: ArgumentPair, context: CauseContext) -> Cause | None:
    if pair.replay.origin is Origin.HOST:
        return Cause(HOST_VALUE_FROZEN,
                     f"the graph passes `{pair.name}` = {_short(pair.replay.value)}, the value it had "
                     f"at capture; eager passes {_short(pair.eager.value)}")
    if isinstance(pair.replay.value, torch.Tensor) and isinstance(pair.eager.value, torch.Tensor) \
            and pair.replay.value.shape != pair.eager.value.shape:
        return Cause(HOST_VALUE_FROZEN,
                     f"`{pair.name}` has shape {tuple(pair.replay.value.shape)} in the graph, "
                     f"{tuple(pair.eager.value.shape)} eagerly: a shape taken from a Python value "
                     f"at capture")
    return None


def rebound(pair: ArgumentPair, context: CauseContext) -> Cause | None:
    if pair.replay.origin is not Origin.EXTERNAL or pair.replay.address == pair.eager.address:
        return None
    first = context.first_use(pair.replay.address or 0)
    now = path_at(context, pair.eager.address)
    then = path_at(context, pair.replay.address)
    captured = context.paths_at_capture.get(pair.replay.address or 0, "")
    reads = f"the graph reads `{pair.name}` at its capture-time address {pair.replay.address:#x}"
    if captured:
        reads += f", where `{captured}` was at capture"
    if then:
        reads += f" (now {then})"
    if first and not captured:
        reads += f", first used at {first}"
    eager = f"eager reads {now or 'another buffer'} at {pair.eager.address:#x}"
    return Cause(BUFFER_REBOUND, f"{reads}; {eager}")


def unwritten_pool(pair: ArgumentPair, context: CauseContext) -> Cause | None:
    if pair.replay.origin is not Origin.POOL or pair.replay.storage in context.written_by_graph \
            or not isinstance(pair.replay.value, torch.Tensor) or not is_poisoned(pair.replay.value):
        return None
    return Cause(NEVER_WRITTEN,
                 f"`{pair.name}` is pool memory that no op of the graph writes: it still holds the "
                 f"capture's poison (a result the captured code expected in a tensor, while the op "
                 f"that computes it wrote another)")


def pool_memory(pair: ArgumentPair, context: CauseContext) -> Cause | None:
    if pair.replay.origin is not Origin.POOL or pair.replay.storage in context.written_by_graph:
        return None
    return Cause(POOL_OVERWRITTEN,
                 f"`{pair.name}` is pool memory at {pair.replay.address:#x} that this replay did not "
                 f"write before reading it: another graph captured into the same pool wrote it "
                 f"({pair.difference})")


def contents_changed(pair: ArgumentPair, context: CauseContext) -> Cause | None:
    if pair.replay.origin is not Origin.EXTERNAL:
        return None
    where = path_at(context, pair.replay.address)
    return Cause(CONTENTS_CHANGED,
                 f"`{pair.name}` is read at the same address by both ({where or hex(pair.replay.address or 0)}), "
                 f"and the graph finds other contents there: {pair.difference}")


def upstream(pair: ArgumentPair, context: CauseContext) -> Cause | None:
    return Cause(UPSTREAM, f"`{pair.name}` was written by this replay and differs: {pair.difference}")


CLASSIFIERS: tuple[Classifier, ...] = (uninitialized, host_value, rebound, unwritten_pool, pool_memory, contents_changed, upstream)


def differing_arguments(eager: Sequence[Value], replay: Sequence[Value], steps: float) -> list[ArgumentPair]:
    by_name = {v.name: v for v in eager}
    pairs = []
    for value in replay:
        other = by_name.get(value.name)
        if other is None:
            continue
        difference = tensor_difference(other.value, value.value, steps)
        moved = (value.origin is Origin.EXTERNAL and isinstance(value.value, torch.Tensor)
                 and value.address != other.address)
        if value.written and other.allocated_at:
            continue  # a destination no op filled yet (`out=` of a fresh `empty`): nothing to read
        if difference or moved:
            pairs.append(ArgumentPair(value.name, other, value, difference or "the same values"))
    # An argument the op writes may be a mere destination (`out=`): what it held before is a cause
    # only when no argument the op just reads differs.
    return sorted(pairs, key=lambda pair: pair.replay.written)


def classify(pair: ArgumentPair, context: CauseContext,
             classifiers: Sequence[Classifier] = CLASSIFIERS) -> Cause:
    for classifier in classifiers:
        cause = classifier(pair, context)
        if cause is not None:
            return cause
    return Cause("unclassified", pair.difference)


def _public_tensors(roots: Callable[[], Mapping[str, Any]] | None, too_deep: set[str]):
    """(path, tensor) of every tensor under the roots by a public path: private attributes (a
    graph's own recording, a device's observers and allocator) are not entered, since they alias
    what they hold; a path nested too deep is added to `too_deep` and skipped, the rest walked."""
    if roots is None:
        return
    for root_name, root in roots().items():
        walk = public_tensor_refs(root, root_name)
        too_deep.update(walk.too_deep)
        for path, ref in walk.refs.items():
            t = ref()
            if t is not None:
                yield path, t


def paths_by_address(roots: Callable[[], Mapping[str, Any]] | None,
                     too_deep: set[str] | None = None) -> dict[int, str]:
    """A pointer snapshot of the roots, by address: which path a tensor starting there has now
    (the paths of `tensors_under`; those skipped as too deep are added to `too_deep`)."""
    found: dict[int, str] = {}
    for path, t in _public_tensors(roots, set() if too_deep is None else too_deep):
        found.setdefault(TensorRecord.of(t).address, path)
    return found


def tensors_under(context: CauseContext):
    """(path, tensor) of every strided tensor under the roots by a public path; the paths skipped
    as nested too deep are collected in `context.too_deep`."""
    for path, t in _public_tensors(context.roots, context.too_deep):
        if t.layout == torch.strided:
            yield path, t


def path_at(context: CauseContext, address: int | None) -> str:
    """The path of a tensor under the roots that starts at `address`, else one whose storage holds it."""
    if address is None:
        return ""
    holder = ""
    for path, t in tensors_under(context):
        if t.data_ptr() == address:
            return f"`{path}`"
        storage = t.untyped_storage()
        if not holder and storage.data_ptr() <= address < storage.data_ptr() + storage.nbytes():
            holder = f"a view of `{path}`'s storage"
    return holder
