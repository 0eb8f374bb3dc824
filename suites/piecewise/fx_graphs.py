"""FX graphs built from `FxGraphSpec`s (harness.check.strategies), with a test op that stands in for
attention: an opaque custom op the split must isolate."""

from __future__ import annotations

import functools

import torch
from torch import fx

from harness.check.strategies import DYNAMIC_FX_OP, FX_WIDTH, FxGraphSpec

DYNAMIC_OP_NAME = "piecewise_test::dynamic"


@torch.library.custom_op(DYNAMIC_OP_NAME, mutates_args=())
def dynamic_op(x: torch.Tensor) -> torch.Tensor:
    return x.cumsum(0) * 0.5


@dynamic_op.register_fake
def _(x):
    return torch.empty_like(x)


def _static(graph: fx.Graph, op: str, args: list[fx.Node], weight: fx.Node) -> fx.Node:
    if op == "add":
        return graph.call_function(torch.add, (args[0], args[1]))
    if op == "mul":
        return graph.call_function(torch.mul, (args[0], args[1]))
    if op == "relu":
        return graph.call_function(torch.relu, (args[0],))
    if op == "tanh":
        return graph.call_method("tanh", (args[0],))
    if op == "linear":
        return graph.call_function(torch.nn.functional.linear, (args[0], weight))
    if op == "scale":
        return graph.call_function(torch.mul, (args[0], 0.75))
    raise ValueError(f"unknown static op {op!r}")


def build_fx_graph(spec: FxGraphSpec, *, packet: bool = False) -> fx.GraphModule:
    """forward(x, y, w): the spec's nodes over inputs x, y [tokens, FX_WIDTH] and weight w; returns
    every value no node reads (so no node is dead). `packet` emits the dynamic op as the overload
    packet instead of `.default`."""
    graph = fx.Graph()
    x, y, w = graph.placeholder("x"), graph.placeholder("y"), graph.placeholder("w")
    values = [x, y]
    target = torch.ops.piecewise_test.dynamic if packet else torch.ops.piecewise_test.dynamic.default
    for node in spec.nodes:
        args = [values[i] for i in node.inputs]
        if node.op == DYNAMIC_FX_OP:
            values.append(graph.call_function(target, (args[0],)))
        else:
            values.append(_static(graph, node.op, args, w))
    read = {i for n in spec.nodes for i in n.inputs}
    sinks = [v for i, v in enumerate(values) if i >= 2 and i not in read] or [values[-1]]
    graph.output(tuple(sinks))
    return fx.GraphModule(torch.nn.Module(), graph)


def is_test_dynamic(node: fx.Node) -> bool:
    from harness.runtime.piecewise.split import node_calls_ops

    return node_calls_ops(node, (DYNAMIC_OP_NAME,))


def inputs_for(tokens: int, seed: int, device: torch.device | str = "cpu"
               ) -> tuple[torch.Tensor, torch.Tensor, torch.nn.Parameter]:
    """x, y [tokens, FX_WIDTH] from `seed`, and the weight of `device` (one Parameter per device,
    so it keeps its address as weights do)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, FX_WIDTH, generator=generator).to(device)
    y = torch.randn(tokens, FX_WIDTH, generator=generator).to(device)
    return x, y, weight(torch.device(device))


@functools.cache
def weight(device: torch.device) -> torch.nn.Parameter:
    values = torch.randn(FX_WIDTH, FX_WIDTH, generator=torch.Generator().manual_seed(7))
    return torch.nn.Parameter(values.to(device), requires_grad=False)
