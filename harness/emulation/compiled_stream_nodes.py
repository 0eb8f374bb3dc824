"""Stream contexts, waits and events inside a graph inductor compiles on the emulated CUDA device.

Dynamo (torch 2.11 on) keeps `with torch.cuda.stream(s):`, `wait_stream`, events and
`record_stream` in the graph: each node made under a stream context carries the stream's index
(`node.meta["custom"]["stream"]`), and the calls are `torch.ops.streams.*` ops naming streams and
events by their index among the objects dynamo hands the graph (torch 2.13 on; 2.11's graphs call
the streams' and events' own methods on those objects, which inductor's code left out: they ran,
if at all, while AOTAutograd traced). On CUDA inductor writes the nodes of each stream inside a
`with streamN:` block, the streams defined where the wrapper enters the device's context, and runs
the ops as fallback calls. The emulated device's graphs are cpu graphs, which enter no device
context: the blocks named streams that were never defined ("NameError: name 'stream1' is not
defined", or `default_stream`), and inductor's cpu code emitted a kernel after a device-less
fallback that followed it, past the line freeing its input ("UnboundLocalError: cannot access
local variable 'arg0_1'").

On the emulated device a graph inductor compiled runs as one op on the current stream (the race
tracking sees it so; compiled_graphs.py). Its stream marks are dropped and its stream ops taken out
of what inductor compiles; they run as the device's own calls around that op, in an order that
keeps every ordering CUDA has and reports no race CUDA would not have:

1. the ops before the graph's first computation, in their order (CUDA runs them before any of
   the graph's work too);
2. the later waits (`wait_stream`, `wait_event`) and host syncs, in their order, then the
   current stream waits for each stream the graph names: the graph's work, CUDA's on those
   streams, comes after all of theirs;
3. the graph, on the current stream;
4. each stream the graph names waits for the current stream (and the current stream for it, so
   that inside a capture no fork is left unjoined), then the later records and host syncs
   (`record_event`, `synchronize_*`, `record_stream`), in their order: an event recorded in the
   graph, work on those streams after it, and the host after a sync come after all of the
   graph's work.

So work on the graph's streams after it and an event recorded in it order after the whole graph,
and the graph after all earlier work on its streams. A race between the graph's own streams is
not seen so: while the race tracking is on, a graph that marks nodes with a stream runs as its
pieces on their streams instead (compiled_stream_pieces.py).

torch 2.11's `event = side.record_event()` is a method call whose result the graph's waits read:
it is taken out with them, and records the event dynamo made while tracing (`TracedEvent`), the
one it hands back to the caller.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch

from harness import torch_internals

# The ops that run in order before the graph when the graph has computed something before them:
# they make a stream wait, and waiting earlier orders the graph after more (never a false race).
_WAITS = frozenset({"wait_stream", "wait_event", "wait"})
# Host syncs after some of the graph's work run on both sides of it: before, so that the graph
# comes after what they wait for; after, so that the host has waited for the graph's work.
_SYNCS = frozenset({"synchronize_event", "synchronize_stream", "synchronize_device",
                    "synchronize"})
# torch 2.11's graphs call the methods of the streams and events themselves
_METHODS = frozenset({"wait_stream", "wait_event", "wait", "record_event", "record",
                      "synchronize"})
# Methods whose answer dynamo folds into the code while it traces (`stream.query()`,
# `event.query()`: a constant over the node): the node's value is never read, and the call is
# dropped with the stream calls.
_FOLDED = frozenset({"query", "elapsed_time"})
# Ops of the namespace that switch the current stream: the emulated device runs the whole graph
# on the current one, so they have nothing to do.
_SWITCHES = frozenset({"fork", "join"})
# The stream index arguments of each op (the others name events, or a device).
_STREAM_ARGUMENTS = {"wait_stream": (0, 1), "wait_event": (1,), "record_event": (1,),
                     "synchronize_stream": (0,), "record_stream": (1,), "sync_dealloc": (1,),
                     "fork": (0, 1), "join": (0, 1)}


@dataclass(frozen=True)
class TensorOf:
    """A tensor argument of a stream op: the graph's input or output at `position`."""

    output: bool
    position: int


@dataclass(frozen=True)
class ObjectAt:
    """A stream or event argument of a method call: the object dynamo hands the graph at
    `index`."""

    index: int


@dataclass(frozen=True)
class TracedEvent:
    """The event torch 2.11's dynamo made for `stream.record_event()` while it traced (the node's
    example value): the object it hands back to the caller, and the one the graph's waits name.
    The call records it on the stream where the graph ran `record_event()` (torch 2.13 on, the
    graph's `record_event` op records the event dynamo returns, at each call)."""

    event: Any


@dataclass(frozen=True)
class StreamCall:
    """One `torch.ops.streams` op, or (torch 2.11's graphs) one method of a stream or event,
    taken out of the graph, with its arguments."""

    name: str
    args: tuple
    method: bool = False  # `args[0].name(*args[1:])`

    def run(self, inputs: tuple, outputs: list) -> Any:
        return self.run_with(lambda a: (outputs if a.output else inputs)[a.position]
                             if isinstance(a, TensorOf) else a)

    def run_with(self, value: Callable[[Any], Any]) -> Any:
        """The call, each argument that is no stream or event given by `value`."""
        args = tuple(graph_object(a.index) if isinstance(a, ObjectAt)
                     else a.event if isinstance(a, TracedEvent) else value(a)
                     for a in self.args)
        if self.method:
            return getattr(args[0], self.name)(*args[1:])
        return getattr(_stream_ops(), self.name).default(*args)


@dataclass(frozen=True)
class StreamCalls:
    """What a graph's stream nodes become around its one op (see the module's docstring)."""

    before: tuple[StreamCall, ...]  # steps 1 and 2's waits
    streams: tuple[int, ...]  # the indices of the streams the graph names
    after: tuple[StreamCall, ...]  # step 4's records and syncs


def _stream_ops() -> Any:
    torch_internals.lazy_module("dynamo_stream_variables")  # defines the ops' namespace
    return torch.ops.streams


def op_name(node: torch.fx.Node, ops: dict) -> str | None:
    """The `torch.ops.streams` op `node` calls (dynamo's graph holds the packet, AOTAutograd's
    the overload), or None."""
    if node.op != "call_function":
        return None
    try:
        return ops.get(node.target)
    except TypeError:  # a target that cannot be hashed is no op of the namespace
        return None


def ops_by_target() -> dict:
    streams = _stream_ops()
    names = (*_STREAM_ARGUMENTS, "synchronize_event", "synchronize_device")
    found = {}
    for name in names:
        packet = getattr(streams, name, None)  # torch 2.11 defines fewer of them
        if packet is not None:
            found[packet] = found[packet.default] = name
    return found


def is_object_lookup(node: torch.fx.Node) -> bool:
    inputs = torch_internals.lazy_module("dynamo_graph_bytecode_inputs")
    return node.op == "call_function" and node.target is inputs.get_external_object_by_index


def method_name(node: torch.fx.Node) -> str | None:
    """The stream or event method `node` calls on an object dynamo hands the graph, or None."""
    if node.op != "call_method" or node.target not in _METHODS or not node.args:
        return None
    return node.target if is_object_lookup(node.args[0]) else None


def stream_calls_of(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The nodes of `gm` that are stream calls, in its order: each `torch.ops.streams` op, and
    each method call whose result no other node uses but such a call (torch 2.11: the event of
    `side.record_event()` waited by `current.wait_event(...)`). A method call whose result
    anything else reads stays in the graph."""
    nodes, ops = list(gm.graph.nodes), ops_by_target()
    taken: set = set()
    for node in reversed(nodes):  # a node's users come after it
        if op_name(node, ops) is not None or folded(node) or (
                method_name(node) is not None and all(u in taken for u in node.users)):
            taken.add(node)
    return [n for n in nodes if n in taken]


def folded(node: torch.fx.Node) -> bool:
    """Whether `node` is a `query()` or `elapsed_time()` of a stream or event dynamo hands the
    graph, or of the event a `record_event()` call made, whose answer dynamo folded (`_FOLDED`)."""
    if node.op != "call_method" or node.target not in _FOLDED or node.users or not node.args:
        return False
    owner = node.args[0]
    return isinstance(owner, torch.fx.Node) and (is_object_lookup(owner)
                                                 or method_name(owner) is not None)


def traced_event(node: torch.fx.Node) -> TracedEvent | None:
    """The event dynamo made while tracing `node`, a `stream.record_event()` of torch 2.11's
    graphs, or None."""
    event = node.meta.get("example_value")
    if node.target != "record_event" or not hasattr(event, "record"):
        return None
    return TracedEvent(event)


def taken_out(gm: torch.fx.GraphModule) -> StreamCalls | None:
    """`gm` without its stream marks and stream calls (changed in place, recompiled), and the
    calls to run around it; None, `gm` unchanged, for a graph without either (`stream_calls_of`
    says which calls)."""
    nodes, ops = list(gm.graph.nodes), ops_by_target()
    marked = [n for n in nodes if isinstance(n.meta.get("custom"), dict)
              and "stream" in n.meta["custom"]]
    calls = stream_calls_of(gm)
    if not marked and not calls:
        return None
    # (a mark's dict may be shared by several nodes: the first pop takes it for all)
    streams = {n.meta["custom"].pop("stream", None) for n in marked} - {None}
    placeholders = [n for n in nodes if n.op == "placeholder"]
    output = next(n for n in nodes if n.op == "output")
    returned = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    prologue, waits, after = [], [], []
    computed = False
    for node in nodes:
        if node not in calls:
            computed = computed or (node.op not in ("placeholder", "output", "get_attr")
                                    and not is_object_lookup(node))
            continue
        if folded(node):
            continue
        name, method = op_name(node, ops), False
        if name is None:
            name, method = method_name(node), True
            # the objects' indices: streams among them are joined, events skipped at the join
            streams.update(a.args[0] for a in node.args if isinstance(a, torch.fx.Node)
                           and is_object_lookup(a))
        else:
            streams.update(node.args[i] for i in _STREAM_ARGUMENTS.get(name, ()))
        args = tuple(_argument(a, placeholders, returned) for a in node.args)
        event = traced_event(node) if method else None
        if event is not None:  # the event dynamo returns and the graph's waits name
            name, args = "record", (event, *args)
        if name in _SWITCHES or any(a is _INSIDE for a in args):
            # a value living only inside the graph, whose uses all run in the graph's one op
            continue
        call = StreamCall(name, args, method)
        if not computed:
            prologue.append(call)
            continue
        if name in _WAITS or name in _SYNCS:
            waits.append(call)
        if name not in _WAITS:
            after.append(call)
    for node in reversed(calls):  # users first: a wait may name a record_event's result
        gm.graph.erase_node(node)
    for node in reversed(list(gm.graph.nodes)):
        if is_object_lookup(node) and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()
    return StreamCalls(tuple(prologue + waits), tuple(sorted(streams)), tuple(after))


_INSIDE = object()  # a tensor argument that is neither an input nor an output of the graph


def _argument(a: Any, placeholders: list, returned: tuple) -> Any:
    if not isinstance(a, torch.fx.Node):
        return a
    if is_object_lookup(a):
        return ObjectAt(a.args[0])
    event = traced_event(a) if method_name(a) is not None else None
    if event is not None:
        return event
    if a in placeholders:
        return TensorOf(False, placeholders.index(a))
    if a in returned:
        return TensorOf(True, returned.index(a))
    return _INSIDE


def compiled_afresh(calls: StreamCalls | None) -> contextlib.AbstractContextManager:
    """Inductor's graph cache off while it compiles a graph whose stream marks were dropped: its
    key reads a graph's code, not the nodes' marks, so code written for the same graph with its
    marks (by an earlier version of the device, or outside it) would be found, and run its
    undefined stream blocks."""
    if calls is None:
        return contextlib.nullcontext()
    return torch_internals.lazy_module("inductor_config").patch(fx_graph_cache=False)


class StreamOrderedGraph:
    """A compiled graph with the stream calls taken out of it run around it (`taken_out`), or,
    where `pieces` applies to a call, the graph's pieces on their streams
    (compiled_stream_pieces.py)."""

    def __init__(self, graph: Callable, calls: StreamCalls, pieces: Any = None) -> None:
        self.graph = graph
        self.calls = calls
        self.pieces = pieces

    def call_boxed(self, boxed: list):
        """The call in inductor's boxed convention (compile_fx_inner's result): the caller's
        list is emptied."""
        args = tuple(boxed)
        boxed.clear()
        return self(*args)

    def __call__(self, *args):
        if self.pieces is not None and self.pieces.apply(self.graph, args):
            return self.pieces(*args)
        calls = self.calls
        for call in calls.before:
            call.run(args, [])
        current = torch.cuda.current_stream()
        streams = [s for s in map(graph_object, calls.streams)
                   if hasattr(s, "wait_stream") and not _same(s, current)]
        for stream in streams:
            current.wait_stream(stream)
        out = self.graph(*args)
        outputs = list(out) if isinstance(out, (tuple, list)) else [out]
        for stream in streams:
            stream.wait_stream(current)
            # and back: inside a capture the wait forks `stream` into it, and a fork left
            # unjoined fails the capture on CUDA
            current.wait_stream(stream)
        for call in calls.after:
            call.run(args, outputs)
        return out


def graph_object(index: int) -> Any:
    inputs = torch_internals.lazy_module("dynamo_graph_bytecode_inputs")
    return inputs.get_external_object_by_index(index)


def _same(a: Any, b: Any) -> bool:
    return (a.stream_id, a.device_index, a.device_type) == (b.stream_id, b.device_index,
                                                            b.device_type)
