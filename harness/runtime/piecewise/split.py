"""Split an FX graph at its dynamic ops.

`split_graph_at_dynamic_ops(gm, is_dynamic)` gives every dynamic op (the attention custom ops, whose
work depends on host-side batch layout) a partition of its own and groups the nodes between them
into maximal static partitions, in the graph's original node order (the graph carries mutations:
the attention op writes into a buffer that a later static node reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import fx
from torch.fx.passes.split_module import split_module

from harness import torch_internals


@dataclass(frozen=True)
class SplitInfo:
    """`split_module` calls `submod_<i>` for every partition i in `order` (execution order);
    `dynamic` are the partitions holding one dynamic op each, `static` the rest."""

    split_module: fx.GraphModule
    dynamic: tuple[int, ...]
    static: tuple[int, ...]

    @property
    def order(self) -> tuple[int, ...]:
        return tuple(sorted(self.dynamic + self.static))

    def submodule(self, index: int) -> torch.nn.Module:
        return getattr(self.split_module, submodule_name(index))


def submodule_name(index: int) -> str:
    return f"submod_{index}"


def op_name(target: Any) -> str | None:
    """`namespace::name` of an op target however dynamo emits it: an OpOverload
    (`torch.ops.ns.op.default`), an OpOverloadPacket (`torch.ops.ns.op`), or a custom-op object that
    wraps one; None for anything else (Python functions, methods, modules)."""
    if isinstance(target, torch_internals.OpOverload):
        target = target.overloadpacket
    if isinstance(target, torch_internals.OpOverloadPacket):
        return target._qualified_op_name
    wrapped = getattr(target, "_opoverload", None)  # torch.library.custom_op's CustomOpDef
    if isinstance(wrapped, torch_internals.OpOverload):
        return op_name(wrapped)
    return None


def node_calls_ops(node: fx.Node, names: frozenset[str] | set[str] | tuple[str, ...]) -> bool:
    """True when `node` calls one of the ops `names` (`namespace::name`)."""
    return node.op == "call_function" and op_name(node.target) in names


def partition_ids(graph: fx.Graph, is_dynamic: Callable[[fx.Node], bool]) -> dict[fx.Node, int]:
    """Partition of every computing node: consecutive ids in node order, a new id for each dynamic
    node and for each run of static nodes that follows one (placeholders, get_attr and the output
    are placed by split_module itself)."""
    ids: dict[fx.Node, int] = {}
    current, in_static_run = -1, False
    for node in graph.nodes:
        if node.op in ("placeholder", "get_attr", "output"):
            continue
        if is_dynamic(node):
            current += 1
            in_static_run = False
        elif not in_static_run:
            current += 1
            in_static_run = True
        ids[node] = current
    return ids


def split_graph_at_dynamic_ops(gm: fx.GraphModule, is_dynamic: Callable[[fx.Node], bool]) -> SplitInfo:
    """Split `gm` so that each node for which `is_dynamic(node)` holds is alone in its partition and
    every maximal run of other nodes between them is one static partition. The original node order
    is kept. A graph without dynamic nodes is one static partition; a graph without any computing
    node has none."""
    ids = partition_ids(gm.graph, is_dynamic)
    dynamic = tuple(sorted({ids[n] for n in ids if is_dynamic(n)}))
    static = tuple(sorted(set(ids.values()) - set(dynamic)))
    split = split_module(gm, gm, lambda node: ids[node], keep_original_order=True)
    return SplitInfo(split_module=split, dynamic=dynamic, static=static)


def mutated_inputs(gm: fx.GraphModule) -> list[str]:
    """Placeholders of `gm` that one of its nodes writes in place (a method or function whose name
    ends in `_`, an OpOverload whose schema marks the argument written, or an `out=`), directly or
    through a view. A static piece must not write its inputs: replay writes the runner's static copy,
    and the caller's tensor would never see the write."""
    origin: dict[fx.Node, str] = {n: n.target for n in gm.graph.nodes if n.op == "placeholder"}
    written: list[str] = []

    def note(arg: Any) -> None:
        if isinstance(arg, fx.Node) and arg in origin and origin[arg] not in written:
            written.append(origin[arg])

    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
        schema = getattr(node.target, "_schema", None)
        if schema is not None:
            for arg, spec in zip(node.args, schema.arguments):
                if spec.alias_info is not None and spec.alias_info.is_write:
                    note(arg)
        elif isinstance(name, str) and name.endswith("_") and not name.endswith("__") and node.args:
            note(node.args[0])
        note(node.kwargs.get("out"))
        if node.op == "call_method" and node.target in _VIEW_METHODS and node.args and node.args[0] in origin:
            origin[node] = origin[node.args[0]]
    return written


_VIEW_METHODS = frozenset({"view", "reshape", "flatten", "unflatten", "__getitem__", "select", "narrow",
                           "transpose", "permute", "unsqueeze", "squeeze", "expand", "as_strided",
                           "t", "view_as", "chunk", "split", "unbind"})
