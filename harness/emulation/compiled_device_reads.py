"""`x.device`, `x.is_cuda`, `x.get_device()` and `x.type()` of a device tensor read inside a
`torch.compile`d function on the emulated CUDA device.

Dynamo answers these from the fake tensor behind each traced tensor, and the emulated device's
tensors are cpu tensors: the fakes say cpu, so that inductor writes cpu code. Code that branches
on the answer (`if x.is_cuda:`, transformers' `hidden_states.device.type == "cuda"`) or passes it
on (`torch.zeros(n, device=x.device)`, `torch.cuda.device(x.device.index)`) would take the host's
path where CUDA takes the device's. For the emulation's duration dynamo's tensor variables answer
instead from where the traced value lives on CUDA: the memory of the graph inputs it comes from,
followed through the graph so far by the rules the graph's outputs are marked with when it runs
(compiled_devices.marks_of_nodes). The fakes, and so inductor's code, stay on the cpu.

An answer that says cuda specializes the trace on the memory of those inputs, as CUDA's guards on
each input's device do: a guard on each input the answer came from makes dynamo trace again when a
later call passes it in the other memory.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import torch

from harness import torch_internals
from harness.emulation import device_indices
from harness.emulation.compiled_devices import (OutputMark, is_marker, marker_device,
                                                marks_of_nodes)
from harness.emulation.device_memory import is_device_memory

Node = torch.fx.Node
# The tensor variables' methods that answer from the variable's device (`x.type()` only without
# arguments: a conversion is a call the placement mode traces).
_READS = ("method_attr_device", "method_attr_is_cuda", "method_get_device", "method_type")


def patches(state) -> list[tuple[Any, str, Any]]:
    """dynamo's tensor variables' device reads, answering from where each value lives on CUDA:
    the methods, and the entries of the method table that torch 2.14 dispatches through
    (`tp_methods`, holding the functions themselves)."""
    owner = torch_internals.lazy_module("dynamo_tensor_variables").TensorVariable
    answering = {read: _answering_cuda(state, read)
                 for read in (vars(owner).get(name) for name in _READS) if callable(read)}
    out = [(owner, read.__name__, answer) for read, answer in answering.items()]
    if "method_attr_is_cpu" not in vars(owner):  # dynamo reads `is_cpu` from the fake itself
        out.append((owner, "method_attr_is_cpu", _is_cpu_answer(state)))
    table = vars(owner).get("tp_methods")
    if isinstance(table, dict):
        out.append((owner, "tp_methods", {
            name: dataclasses.replace(entry, handler=answering[entry.handler])
            if getattr(entry, "handler", None) in answering else entry
            for name, entry in table.items()}))
    return out


def _answering_cuda(state, read: Callable) -> Callable:
    @functools.wraps(read)
    def answer(self, tx, *args, **kwargs):
        traced = self.device
        if args or kwargs or not (isinstance(traced, torch.device) and traced.type == "cpu"):
            return read(self, tx, *args, **kwargs)
        device = cuda_device(state, tx.output, self)
        if device is None:
            return read(self, tx, *args, **kwargs)
        # each read builds its answer from `self.device` in its own form (a device, a bool, an
        # index, a type name): the device is swapped in for the read alone
        self.device = device
        try:
            return read(self, tx, *args, **kwargs)
        finally:
            self.device = traced

    return answer


def _is_cpu_answer(state) -> Callable:
    constant = torch_internals.lazy_module("dynamo_tensor_variables").ConstantVariable

    def method_attr_is_cpu(self, tx):
        traced = self.device
        if (isinstance(traced, torch.device) and traced.type == "cpu"
                and cuda_device(state, tx.output, self) is not None):
            return constant.create(False)
        return None  # dynamo reads the fake, as without this method

    return method_attr_is_cpu


def cuda_device(state, output: Any, variable: Any) -> torch.device | None:
    """The device a traced tensor is on for CUDA when the trace says cpu: cuda:i for device
    memory, None for host memory (the fake's answer stands). Either way the graph inputs the
    answer comes from are guarded to keep their memory at later calls."""
    node = getattr(getattr(variable, "proxy", None), "node", None)
    if not isinstance(node, Node):
        return None
    mark, inputs = _memory(output, node)
    _guard(inputs)
    if mark is None or not mark.device:
        return None
    index = next((device_indices.index_of(value) for _, value in inputs
                  if is_device_memory(value)), 0)
    return state.device_object(index if state.properties.count > 1 else 0)


def _memory(output: Any, node: Node) -> tuple[OutputMark | None, list[tuple[Node, torch.Tensor]]]:
    """Where `node`'s value lives (compiled_devices.marks_of_nodes over the nodes it comes from)
    and the inputs, each a (placeholder, real tensor), whose memory decides it."""
    ancestors = _ancestors(node)
    ordered = [n for n in node.graph.nodes if n in ancestors]
    inputs: dict[Node, OutputMark | None] = {}
    deciding: list[tuple[Node, torch.Tensor]] = []
    for n in ordered:
        if n.op == "get_attr":
            value = _attribute(output, n.target)
        elif n.op == "placeholder":
            value = _input_value(output, n)
        else:
            continue
        if isinstance(value, Node):  # a nested graph's input, lifted from its parent graph
            inputs[n], more = _memory(output, value)
            deciding += more
        elif isinstance(value, torch.Tensor):
            inputs[n] = OutputMark(is_device_memory(value))
            deciding.append((n, value))
    on_device = any(mark is not None and mark.device
                    for n, mark in inputs.items() if n.op == "placeholder")
    marks = marks_of_nodes(ordered, inputs.get, on_device)
    return marks.get(node), deciding


def _ancestors(node: Node) -> set[Node]:
    """The nodes `node`'s memory depends on: its inputs, back to the graph's inputs or to a
    transfer naming its memory; every input of the graph where a `to_traced_device` marker (the
    graph's own device) is among them."""
    found: set[Node] = set()
    stack, graph_device = [node], False
    while stack:
        current = stack.pop()
        if current in found:
            continue
        found.add(current)
        if is_marker(current):
            if marker_device(current.target) is not None:
                continue
            graph_device = True
        stack.extend(current.all_input_nodes)
    if graph_device:
        found.update(node.graph.find_nodes(op="placeholder"))
    return found


def _input_value(output: Any, node: Node) -> Any:
    """The real value dynamo was given for a placeholder, or, for a nested graph's (a
    higher-order op's body), the parent graph's node it lifted; None where neither is known (a
    body's own arguments)."""
    grapharg = node.meta.get("grapharg")
    if grapharg is not None:
        return grapharg.example
    tracer = output.current_tracer
    while tracer is not None and tracer.graph is not node.graph:
        tracer = tracer.parent
    for parent, child in getattr(tracer, "lifted_freevars", {}).items():
        if child.node is node:
            return parent.node
    return None


def _attribute(output: Any, target: str) -> Any:
    value = getattr(output, "nn_modules", {}).get(target)
    return value if isinstance(value, torch.Tensor) else None


def _guard(inputs: list[tuple[Node, torch.Tensor]]) -> None:
    """A guard per graph input that the input's memory stays what it was traced with."""
    guards = torch_internals.lazy_module("dynamo_guards")
    for node, value in inputs:
        source = getattr(node.meta.get("grapharg"), "source", None)
        if source is None:
            continue
        create = _guard_device_memory if is_device_memory(value) else _guard_host_memory
        try:
            guard = source.make_guard(create)
        except NotImplementedError:  # a constant's source: nothing to match at a later call
            continue
        guards.install_guard(guard)


def _guard_device_memory(builder: Any, guard: Any) -> None:
    _add_memory_guard(builder, guard, True)


def _guard_host_memory(builder: Any, guard: Any) -> None:
    _add_memory_guard(builder, guard, False)


def _add_memory_guard(builder: Any, guard: Any, on_device: bool) -> None:
    guards = torch_internals.lazy_module("dynamo_guards")

    def same_memory(value: Any) -> bool:
        return isinstance(value, torch.Tensor) and is_device_memory(value) is on_device

    check = f"___harness_{'device' if on_device else 'host'}_memory({guard.name})"
    builder.get_guard_manager(guard).add_lambda_guard(
        same_memory, guards.get_verbose_code_parts(check, guard), guard.user_stack)
