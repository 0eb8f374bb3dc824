"""A graph with stream contexts that inductor compiles, run on its streams while the race
tracking is on.

On CUDA inductor writes the kernels of the nodes marked with a stream inside a `with streamN:`
block and the others on the stream current when the graph runs, in the graph's order, and adds no
wait of its own between the streams: its scheduler only keeps a fusion from crossing a stream
boundary (`Scheduler.can_fuse`, `generate_stream_ctx_switching` in torch/_inductor/scheduler.py).
A buffer a side stream writes and the current stream reads without the graph's own wait is a race
there, as in eager code.

The emulated device runs an inductor graph as one op on the current stream (compiled_graphs.py,
compiled_stream_nodes.py), which hides the buffers between the graph's streams from the tracking.
While the tracking is on, outside a capture and CUDA graphs, a graph that marks nodes with a
stream runs as its pieces instead: each run of consecutive nodes on one stream is a graph of its
own, compiled by inductor's `compile_fx` at its first call with each input layout and called on
its stream (one op there, as any compiled graph); the stream calls between the pieces run in
their place. What crosses from one piece to another is device memory the tracking sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness import torch_internals
from harness.emulation.compiled_partitions import piece_inputs, piece_module
from harness.emulation.compiled_stream_nodes import (ObjectAt, StreamCall, folded,
                                                     graph_object, is_object_lookup, method_name,
                                                     op_name, ops_by_target, stream_calls_of,
                                                     traced_event)

# ops of the namespace that switch the current stream: the pieces run on their marks' streams
_SWITCHES = frozenset({"fork", "join"})


@dataclass(frozen=True)
class NodeValue:
    """The value of the whole graph's node `name` (an input, or a piece's or call's result)."""

    name: str


@dataclass(frozen=True)
class Piece:
    """Consecutive nodes of the graph on one stream, as a graph of their own."""

    module: torch.fx.GraphModule
    inputs: tuple[str, ...]  # the whole graph's nodes it reads
    outputs: tuple[str, ...]  # its nodes that later steps or the graph's output read
    stream: int | None  # the index of the stream object dynamo hands the graph; None: current
    computes: bool  # some node makes a tensor: compiled by inductor; else run as it is


@dataclass(frozen=True)
class CallStep:
    call: StreamCall
    result: str | None  # the node whose value the call's result is, where later calls read it


@dataclass(frozen=True)
class Plan:
    placeholders: tuple[str, ...]
    steps: tuple  # Piece and CallStep, in the graph's order
    result: Any  # the graph's output, NodeValue leaves
    refusal: str | None = None  # why the graph cannot run as pieces (raised when they would)


def plan_of(gm: torch.fx.GraphModule) -> Plan | None:
    """The pieces of dynamo's graph `gm`, read before its marks and calls are taken out of it
    (compiled_stream_nodes.taken_out); None where no node is marked with a stream."""
    nodes = list(gm.graph.nodes)
    calls = set(stream_calls_of(gm))
    marks = {n: n.meta["custom"]["stream"] for n in nodes
             if n.op != "placeholder" and isinstance(n.meta.get("custom"), dict)
             and n.meta["custom"].get("stream") is not None}
    if not marks:
        return None
    ops = ops_by_target()
    steps: list = []
    groups: list[tuple[int | None, list]] = []  # pieces being gathered, by position in steps
    output = None
    for node in nodes:
        if node.op == "placeholder" or is_object_lookup(node):
            continue
        if node.op == "output":
            output = node
            continue
        if node in calls:
            if folded(node):
                continue
            name, method = op_name(node, ops), False
            if name is None:
                name, method = method_name(node), True
            if name in _SWITCHES:
                continue
            args = tuple(_argument(a) for a in node.args)
            event = traced_event(node) if method else None
            if event is not None:
                name, args = "record", (event, *args)
            steps.append(CallStep(StreamCall(name, args, method),
                                  node.name if node.users and event is None else None))
            continue
        stream = marks.get(node)
        if steps and isinstance(steps[-1], list) and groups[-1][0] == stream:
            steps[-1].append(node)
        else:
            members: list = [node]
            steps.append(members)
            groups.append((stream, members))
    placeholders = tuple(n.name for n in nodes if n.op == "placeholder")
    result = torch.fx.map_arg(output.args[0], lambda n: NodeValue(n.name))
    for _, members in groups:
        for node in members:
            read = next((m for m in node.all_input_nodes if is_object_lookup(m)), None)
            if read is not None:
                return Plan(placeholders, (), result, refusal=(
                    f"node {node.name} of a compiled graph reads a stream or event ({read.name}) "
                    f"as a value, which the emulated CUDA device cannot pass between the pieces "
                    f"it runs on the graph's streams under the race tracking; enter "
                    f"emulate_cuda(races='off') to run the graph as one op, untracked"))
    streams = iter(stream for stream, _ in groups)
    built = tuple(step if isinstance(step, CallStep) else _piece(gm, step, next(streams))
                  for step in steps)
    return Plan(placeholders, built, result)


def _argument(a: Any) -> Any:
    if not isinstance(a, torch.fx.Node):
        return a
    if is_object_lookup(a):
        return ObjectAt(a.args[0])
    event = traced_event(a) if method_name(a) is not None else None
    return event if event is not None else NodeValue(a.name)


def _piece(gm: torch.fx.GraphModule, members: list, stream: int | None) -> Piece:
    inside = set(members)
    inputs = piece_inputs(members)
    # read by the graph's output, a later piece, or a stream call (`record_stream`)
    outputs = [n for n in members if any(user not in inside for user in n.users)]
    module = piece_module(gm, members, inputs, outputs, _without_stream_mark)
    computes = any(isinstance(n.meta.get("example_value", n.meta.get("val")), torch.Tensor)
                   for n in members)
    return Piece(module, tuple(n.name for n in inputs),
                 tuple(n.name for n in outputs), stream, computes)


def _without_stream_mark(node: torch.fx.Node, copy: torch.fx.Node) -> None:
    custom = node.meta.get("custom")
    if isinstance(custom, dict):  # the piece runs on its stream: no mark for inductor
        copy.meta["custom"] = {k: v for k, v in custom.items() if k != "stream"}


class StreamPieces:
    """A plan's pieces, compiled per input layout at their first call, run on their streams."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.compiled: dict[tuple, Any] = {}  # (step, layout) -> what compile_fx returned

    @staticmethod
    def apply(graph: Any, args: tuple) -> bool:
        """Whether a call of `graph` (the whole graph's compiled code) runs as the pieces: the
        race tracking on, outside a capture, without CUDA graphs, and nothing for autograd to
        differentiate (those run as the whole graph's one op, see docs/fidelity.md)."""
        from harness.emulation.active import active_state, emulation_active

        if emulation_active() != "cpu":
            return False
        state = active_state()
        if state.streams_tracking is None or state.capturing():
            return False
        if getattr(graph, "cudagraphs", False) or getattr(graph, "autograd_split", False):
            return False
        return not (torch.is_grad_enabled() and any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in args))

    def __call__(self, *args):
        if self.plan.refusal is not None:
            from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice

            raise UnsupportedOnEmulatedDevice(self.plan.refusal)
        values = dict(zip(self.plan.placeholders, args))

        def value(a: Any) -> Any:
            return values[a.name] if isinstance(a, NodeValue) else a

        current = torch.cuda.current_stream()
        for index, step in enumerate(self.plan.steps):
            if isinstance(step, CallStep):
                result = step.call.run_with(value)
                if step.result is not None:
                    values[step.result] = result
                continue
            inputs = [values[name] for name in step.inputs]
            stream = current if step.stream is None else graph_object(step.stream)
            with torch.cuda.stream(stream):
                outs = self._compiled(index, step, inputs)(*inputs)
            values.update(zip(step.outputs, outs))
        return _filled(self.plan.result, value)

    def _compiled(self, index: int, piece: Piece, inputs: list) -> Any:
        if not piece.computes:
            return piece.module
        key = (index, tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor)
                            else a for a in inputs))
        found = self.compiled.get(key)
        if found is None:
            # a graph of its own per layout: inductor's passes change the graph they compile
            graph = torch.fx.Graph()
            graph.output(graph.graph_copy(piece.module.graph, {}))
            module = torch.fx.GraphModule(piece.module, graph)
            compile_fx = torch_internals.lazy_module("inductor_compile_fx").compile_fx
            found = self.compiled[key] = compile_fx(module, list(inputs))
        return found


def _filled(result: Any, value: Any) -> Any:
    if isinstance(result, (tuple, list)):
        return type(result)(_filled(r, value) for r in result)
    return value(result)
