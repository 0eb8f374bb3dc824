"""An op issued from FX-generated code (a dynamo graph, a piecewise segment) is named by the model
line its node was traced from, not by the generated `<eval_with_key>` line; where the node has no
stack trace the generated line stays, and the report says so."""

from __future__ import annotations

import inspect
import os

import torch
import torch.fx

from harness.check import explain_divergence
from harness.check.causes import BUFFER_REBOUND
from harness.graphs.emulator.fx_lines import NO_STACK_TRACE


def _line_of(snippet: str) -> str:
    lines, _ = inspect.getsourcelines(inspect.getmodule(_line_of))
    number = next(i for i, line in enumerate(lines, 1) if snippet in line and "_line_of" not in line)
    return f"{os.path.relpath(__file__)}:{number}"


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.full((8,), 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + 1
        return y * self.scale  # the op the rebound scale reaches


def _dynamo_graph(module: torch.nn.Module) -> torch.fx.GraphModule:
    """The GraphModule dynamo traces from `module` (run by FX's generated code, as a piecewise
    segment is)."""
    traced: list[torch.fx.GraphModule] = []

    def keep(gm, example_inputs):
        traced.append(gm)
        return gm

    torch.compile(module, backend=keep, dynamic=False)(torch.ones(8))
    return traced[0]


def _rebound_step(graph_module, module: Scaled, inputs):
    def step(backend):
        graph = backend.capture(lambda: graph_module(*inputs))
        graph.replay()
        old = module.scale
        module.scale = torch.full((8,), 3.0)  # the planted bug: the graph keeps the old buffer
        inputs[-1] = module.scale
        graph.replay()
        return old
    return step


def test_an_op_of_a_dynamo_graph_is_named_by_the_model_line():
    module = Scaled()
    gm = _dynamo_graph(module)
    placeholders = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 2, gm.code  # the input and the scale, lifted by dynamo
    inputs = [torch.ones(8), module.scale]
    explanation = explain_divergence(_rebound_step(gm, module, inputs), roots=lambda: {"module": module})
    assert explanation.diverged and explanation.op == "aten.mul.Tensor", explanation
    assert explanation.where.startswith(_line_of("return y * self.scale")), explanation.where
    assert "<eval_with_key>" not in explanation.where
    assert explanation.cause.kind == BUFFER_REBOUND, explanation


def _scaled(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x + 1) * scale


def test_a_node_without_a_stack_trace_keeps_the_generated_line_and_says_so():
    gm = torch.fx.symbolic_trace(_scaled)  # symbolic_trace records no stack traces
    assert all(not n.stack_trace for n in gm.graph.nodes)
    holder = {"scale": torch.full((8,), 2.0)}
    kept = []

    def step(backend):
        x = torch.ones(8)
        graph = backend.capture(lambda: gm(x, holder["scale"]))
        graph.replay()
        kept.append(holder["scale"])
        holder["scale"] = torch.full((8,), 3.0)  # the planted bug: the graph keeps the old buffer
        graph.replay()

    explanation = explain_divergence(step, roots=lambda: {"holder": holder})
    assert explanation.diverged and explanation.op == "aten.mul.Tensor", explanation
    assert explanation.where.startswith("<eval_with_key>"), explanation.where
    assert explanation.where.endswith(f"({NO_STACK_TRACE})"), explanation.where
