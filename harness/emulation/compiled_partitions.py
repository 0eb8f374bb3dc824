"""Inductor's graph partition on the emulated CUDA device.

With `graph_partition` on (inductor's default since torch 2.11) and CUDA graphs asked for
(`triton.cudagraphs`: mode="reduce-overhead" or inductor's config), inductor does not skip a graph
with cpu nodes: its scheduler splits the graph at each node CUDA graphs cannot hold (an op on the
host, a copy between host and device, an op tagged `cudagraph_unsafe`), after reordering the
nodes so that there are as few partitions as it can make, and wraps each partition of device work
in cudagraph trees (`cudagraphify`, one function per partition); the other nodes run as plain code
between them. A graph without device work has no partition and runs without CUDA graphs, no skip
counted.

The emulated device's graphs are compiled for the cpu its tensors live on, where inductor finds
no partition to make, so the device splits dynamo's graph itself, by the same rules over its
nodes, where a node's memory is the one CUDA gives it (compiled_devices.py): `partitions` returns
the pieces, each a graph of its own with its inputs and outputs among the whole graph's nodes, in
the order they run. compiled_graphs.py runs each piece as a graph of its own: the pieces of device
work through the trees, the others as host code. Inductor's reorder keeps to a peak-memory budget
(`triton.cudagraph_partition_memory_budget`), which the device does not estimate: it always
reorders. Nodes that make no tensor (sizes, symbolic arithmetic) are none of inductor's scheduled
nodes and split nothing: each runs where its inputs are ready.

Before it schedules, inductor moves a 0-dim host input to the device under graph partition
(`move_constructors_to_gpu`: its ConstructorMoverPass takes cpu scalar placeholders when
`triton.cudagraphs` and `graph_partition` are on): one copy to the device before the device work,
the input's reads then device work, and a write to it in place computed on the device and copied
back to the host after the device work (the pass leaves the `copy_` into the input on the host).
`_scalars_moved` rewrites dynamo's graph the same way before it is cut.
"""

from __future__ import annotations

import heapq
import operator
from dataclasses import dataclass
from typing import Callable

import torch

from harness import torch_internals
from harness.emulation.compiled_devices import (OutputMark, is_marker, made_for_a_marker,
                                                memory_of_nodes, to_device)


@dataclass(frozen=True)
class Partition:
    """One piece of a partitioned graph: a graph of its own over some of the whole graph's nodes."""

    module: torch.fx.GraphModule
    inputs: tuple  # the whole graph's nodes it reads (placeholders, other pieces' outputs)
    outputs: tuple  # its nodes that later pieces or the whole graph's output read
    cudagraphable: bool  # device work, replayed through the trees; else host code
    static: frozenset  # its inputs (by position) that are static inputs of the whole graph


@dataclass(frozen=True)
class Partitioned:
    """A graph as inductor's graph partition runs it: `module`, dynamo's graph with the 0-dim
    host inputs it moves to the device rewritten (`_scalars_moved`), and its pieces, whose inputs
    and outputs are nodes of `module`, in the order they run."""

    module: torch.fx.GraphModule
    pieces: tuple


def partitions_apply(backend: str) -> bool:
    """Whether inductor would partition the graphs it wraps in CUDA graphs now
    (`is_using_cudagraph_partition`: graph partition on, and CUDA graphs through inductor's own
    config or a reduce-overhead compile). Dynamo's cudagraphs backend never partitions: it skips
    a graph with cpu nodes."""
    config = torch_internals.lazy_module("inductor_config")
    return bool(getattr(config, "graph_partition", False)) and backend != "cudagraphs"


def partitions(graph_module: torch.fx.GraphModule, args,
               static: frozenset) -> Partitioned | None:
    """The pieces inductor's graph partition makes of `graph_module` called with `args` (whose
    inputs at the positions `static` are static); None when every node is device work CUDA
    graphs can hold (nothing to split)."""
    graph_module, moved = _scalars_moved(graph_module, args)
    marks = memory_of_nodes(graph_module, args)
    nodes = [n for n in graph_module.graph.nodes
             if n.op not in ("placeholder", "get_attr", "output")]
    kinds = {n: _HOST if n in moved else _kind(n, marks) for n in nodes}
    if all(kind != _HOST for kind in kinds.values()):
        return None
    # inductor orders writes by their dependencies; dynamo's graph holds them only in its order
    order = nodes if any(_writes(n) for n in nodes) else _reordered(nodes, kinds)
    groups = _grouped(order, kinds)
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    static_nodes = {placeholders[i] for i in static if i < len(placeholders)}
    output = next(n for n in graph_module.graph.nodes if n.op == "output")
    position = {n: i for i, (_, members) in enumerate(groups) for n in members}
    pieces = []
    for index, (cudagraphable, members) in enumerate(groups):
        inputs = piece_inputs(members)
        outputs = tuple(n for n in members if any(
            user is output or position.get(user, index) > index for user in n.users))
        pieces.append(Partition(piece_module(graph_module, members, inputs, outputs),
                                tuple(inputs), outputs, cudagraphable,
                                frozenset(i for i, n in enumerate(inputs) if n in static_nodes)))
    return Partitioned(graph_module, tuple(pieces))


def _scalars_moved(graph_module: torch.fx.GraphModule,
                   args) -> tuple[torch.fx.GraphModule, frozenset]:
    """`graph_module` with each 0-dim host input that inductor's ConstructorMoverPass moves to
    the device (`_movable_scalars`) read from a copy on the device, and the nodes that copy
    between host and device (inductor's DeviceCopy, each a cut of the graph): the copy to the
    device first; a graph writing the input in place works on a clone of it on the device
    (a buffer of the device work, as inductor's functional graph computes the new value) and
    copies the clone back into the input last. A marker that copies the input to the device
    reads a clone of the device's copy: it holds the value at that point, where a view of it
    would see a later write. Unchanged, with no such node, when nothing moves."""
    marks = memory_of_nodes(graph_module, args)
    scalars = _movable_scalars(graph_module, args, marks)
    if not scalars:
        return graph_module, frozenset()
    graph = torch.fx.Graph()
    env: dict = {}
    output = None
    for node in graph_module.graph.nodes:
        if node.op == "output":
            output = node
            continue
        env[node] = graph.node_copy(node, lambda m: env[m])
    # fx keeps the placeholders first: the copies go in before any other node
    last_placeholder = [env[n] for n in graph_module.graph.nodes if n.op == "placeholder"][-1]
    moved: set = set()
    copies_back = []
    for scalar in scalars:
        written = any(_writes(user) and user.args and user.args[0] is scalar
                      for user in scalar.users)
        with graph.inserting_after(last_placeholder):
            copy = graph.call_function(to_device, (env[scalar],))
        copy.meta = dict(scalar.meta)
        moved.add(copy)
        read = copy
        if written:
            with graph.inserting_after(copy):
                read = graph.call_function(torch.clone, (copy,))
            read.meta = dict(scalar.meta)
            copies_back.append((env[scalar], read))
        for user in scalar.users:
            if user.op == "output":
                continue
            new = env[user]
            if written and is_marker(user) and marks.get(user, OutputMark(False)).device:
                new.target, new.args, new.kwargs = torch.clone, (read,), {}
            else:
                new.replace_input_with(env[scalar], read)
    for scalar, value in copies_back:
        back = graph.call_method("copy_", (scalar, value))
        back.meta = dict(scalar.meta)
        moved.add(back)
    graph.output(torch.fx.map_arg(output.args[0], lambda m: env[m]))
    return torch.fx.GraphModule(graph_module, graph), frozenset(moved)


def _movable_scalars(graph_module: torch.fx.GraphModule, args, marks: dict) -> list:
    """The 0-dim host inputs inductor's ConstructorMoverPass moves to the device (graph partition
    with CUDA graphs on; see `partitions_apply`): read by the graph, in a graph with device work,
    whose uses on the host lead only to device work or the graph's output through ops inductor
    can move (aten's, not a custom op's or a higher-order operator's), reading no host tensor of
    one or more dimensions beside them (those keep the whole chain on the host)."""
    if not any(mark.device for mark in marks.values()):
        return []
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    scalars = {n for n, a in zip(placeholders, args)
               if isinstance(a, torch.Tensor) and not a.dim() and n.users
               and n in marks and not marks[n].device}
    return [n for n in placeholders if n in scalars and _moves(n, scalars, marks)]


def _moves(scalar: torch.fx.Node, scalars: set, marks: dict) -> bool:
    """Whether every host use downstream of `scalar` can move with it (find_movable_constructors:
    a user on the device takes it as it is; a host user moves when each host tensor it reads
    moves too)."""
    moving = {scalar} | scalars
    queue = [scalar]
    while queue:
        node = queue.pop()
        for user in node.users:
            if user.op == "output":
                continue  # allow_outputs
            if not _movable_op(user):
                return False
            if marks.get(user, OutputMark(False)).device:
                continue
            if any(m not in moving and m in marks and not marks[m].device
                   for m in user.all_input_nodes):
                return False
            if user not in moving:
                moving.add(user)
                queue.append(user)
    return True


def _movable_op(node: torch.fx.Node) -> bool:
    """An op inductor's mover can move: what AOTAutograd makes aten or prims ops of (a torch
    function, a tensor method, a transfer marker), not a custom op or a higher-order operator."""
    if node.op == "call_method":
        return True
    if node.op != "call_function":
        return False
    target = node.target
    if isinstance(target, (torch_internals.OpOverload, torch_internals.OpOverloadPacket)):
        return target.namespace in ("aten", "prims")
    return not isinstance(target, torch_internals.HigherOrderOperator)


# A node's kind: device work CUDA graphs hold, work they cannot hold, or neither (no tensor made)
_DEVICE, _HOST, _FREE = "device", "host", "free"


def _kind(node: torch.fx.Node, marks: dict) -> str:
    """Inductor's `should_partition`, over dynamo's node: host memory made or read as a copy
    (its cpu ops and DeviceCopy), an op tagged cudagraph_unsafe, else device work. A node making
    no tensor is neither, nor one making a host scalar (no dimensions) or copying one: a cpu
    scalar passes beside device tensors, and the device counts no cpu node for it
    (compiled_devices.placement)."""
    value = _value(node)
    if not _has_tensors(value) or _host_scalar(node, value, marks):
        return _FREE
    if _unsafe(node):
        return _HOST
    mark: OutputMark | None = marks.get(node)
    if is_marker(node):
        source = node.args[0] if node.args else None
        if isinstance(source, torch.fx.Node) and _factory_for_a_marker(source):
            # a factory naming the device, traced on the cpu: made where the marker says
            return _DEVICE if mark is not None and mark.device else _HOST
        read = marks.get(source) if isinstance(source, torch.fx.Node) else None
        copies = read is None or mark is None or read.device != mark.device
        return _HOST if copies or not mark.device else _DEVICE
    if _factory_for_a_marker(node):
        return _DEVICE if any(marks.get(user, OutputMark(False)).device
                              for user in node.users) else _HOST
    return _DEVICE if mark is not None and mark.device else _HOST


def _host_scalar(node: torch.fx.Node, value, marks: dict) -> bool:
    if not isinstance(value, torch.Tensor) or value.dim():
        return False
    mark = marks.get(node)
    if mark is not None and not mark.device:
        return True
    source = node.args[0] if is_marker(node) and node.args else None
    return isinstance(source, torch.fx.Node) and source in marks and not marks[source].device


def _value(node: torch.fx.Node):
    """A node's traced value: dynamo's graphs keep it as `example_value`, AOTAutograd's as `val`."""
    return node.meta.get("val", node.meta.get("example_value"))


def _factory_for_a_marker(node: torch.fx.Node) -> bool:
    """A factory (a call reading no tensor) whose value only markers use: one naming a device,
    which the trace made on the cpu."""
    return made_for_a_marker(node) and not any(_has_tensors(_value(m))
                                               for m in node.all_input_nodes)


def _writes(node: torch.fx.Node) -> bool:
    """Whether `node` writes a tensor in place (a method or function ending in "_", an item
    assignment, a mutable operator): a later read of it depends on the order no edge shows."""
    target = node.target
    name = target if node.op == "call_method" else getattr(target, "__name__", "")
    if isinstance(name, str) and name.endswith("_") and not name.endswith("__"):
        return True
    if target is operator.setitem:
        return True
    schema = getattr(target, "_schema", None)
    return bool(schema is not None and getattr(schema, "is_mutable", False))


def _has_tensors(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (tuple, list)) and any(_has_tensors(v) for v in value)


def _unsafe(node: torch.fx.Node) -> bool:
    tag = getattr(torch.Tag, "cudagraph_unsafe", None)
    return (tag is not None and node.op == "call_function"
            and isinstance(node.target, torch_internals.OpOverload) and tag in node.target.tags)


def _reordered(nodes: list, kinds: dict) -> list:
    """Inductor's order for fewest partitions (`reorder_for_minimizing_partition`: a topological
    order that takes every ready node CUDA graphs cannot hold, then every ready device node, in
    turn, each in the graph's order), then `reorder_for_partition_with_simple_dependency` (such
    a node that reads no other node first, one only the output reads last). A node that makes no
    tensor runs as soon as it is ready. Only for a graph that writes nothing in place (`_writes`:
    the order of a write and its reads is not in the graph's edges)."""
    index = {n: i for i, n in enumerate(nodes)}
    inside = set(nodes)
    waiting = {n: len([m for m in n.all_input_nodes if m in inside]) for n in nodes}
    host: list = []
    device: list = []
    order: list = []

    def ready(node) -> None:
        if kinds[node] == _FREE:
            take(node)
        else:
            heapq.heappush(host if kinds[node] == _HOST else device, (index[node], node))

    def take(node) -> None:
        order.append(node)
        for user in node.users:
            if user in waiting:
                waiting[user] -= 1
                if waiting[user] == 0:
                    ready(user)

    for node in nodes:
        if waiting[node] == 0:
            ready(node)
    while host or device:
        while host:
            take(heapq.heappop(host)[1])
        while device:
            take(heapq.heappop(device)[1])
    if len(order) != len(nodes):  # not a DAG over these nodes: keep the graph's order
        order = list(nodes)
    front = [n for n in order if kinds[n] == _HOST and not any(m in inside for m in n.all_input_nodes)]
    back = [n for n in order if kinds[n] == _HOST and n not in front and n.users
            and all(user.op == "output" for user in n.users)]
    taken = set(front) | set(back)
    return front + [n for n in order if n not in taken] + back


def _grouped(order: list, kinds: dict) -> list[tuple[bool, list]]:
    """Runs of consecutive nodes of one kind (device work or not), as inductor's
    `graph_partition` cuts its scheduled nodes; a node making no tensor joins the run it is in."""
    groups: list[tuple[bool, list]] = []
    pending: list = []  # free nodes before the first node of a kind
    for node in order:
        kind = kinds[node]
        if kind == _FREE:
            (groups[-1][1] if groups else pending).append(node)
            continue
        device = kind == _DEVICE
        if not groups or groups[-1][0] != device:
            groups.append((device, pending + [node]))
            pending = []
        else:
            groups[-1][1].append(node)
    if pending:
        groups.append((False, pending))
    return groups


def piece_inputs(members: list) -> list:
    """The nodes outside `members` that they read (attributes aside), in the order first read."""
    inside = set(members)
    inputs: list = []
    for node in members:
        for m in node.all_input_nodes:
            if m not in inside and m.op != "get_attr" and m not in inputs:
                inputs.append(m)
    return inputs


def piece_module(graph_module: torch.fx.GraphModule, members: list, inputs: list,
                 outputs: tuple | list, copied: Callable | None = None) -> torch.fx.GraphModule:
    """A graph of `members` (in that order) reading `inputs` and returning `outputs` (a tuple);
    the whole graph's attributes it reads are its own attributes. `copied(node, copy)`, if given,
    sees each member with its copy."""
    graph = torch.fx.Graph()
    env: dict = {}
    for node in inputs:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
    for node in members:
        for m in node.all_input_nodes:
            if m.op == "get_attr" and m not in env:
                env[m] = graph.node_copy(m)
        env[node] = graph.node_copy(node, lambda m: env[m])
        if copied is not None:
            copied(node, env[node])
    graph.output(tuple(env[n] for n in outputs))
    return torch.fx.GraphModule(graph_module, graph)
