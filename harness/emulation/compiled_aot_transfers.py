"""Transfers in AOTAutograd's graphs of a backend of eager ops on the emulated CUDA device.

Dynamo traces the device's cpu tensors, so a transfer between host and device is kept in its graph
as a marker (compiled_devices.py), which AOTAutograd traces into `aten.alias`: a view, where the
memory a value lives in is read when the graph runs. Inductor's graphs are code for the cpu and
the device places their outputs afterwards; a backend whose graphs run as eager ops (aot_eager,
aot_eager_decomp_partition, a runtime's own) runs them through the device's placement mode, op by
op, where an alias of host memory stays host memory and meets device tensors in the next op: a
mixed-device error where CUDA copies.

So while such a backend compiles a graph for training (the forward, and the backward compiled
later), each marker's alias in AOTAutograd's graphs becomes the transfer it stands for, before
the backend's compiler sees the graph, as CUDA's graphs hold `_to_copy`: a factory made on the
host for the marker (a factory naming cuda, traced on the cpu) names the marker's device instead,
so it is made and drawn there. A `to_traced_device` marker (`x.device` read in the trace) goes to
the device when any of the graph's inputs is device memory, as dynamo's graph places it. An
inference graph runs as the device's graph of one op (compiled_graphs.py), which places its
outputs, and is left as it is.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterator

import torch

from harness import torch_internals
from harness.emulation.compiled_devices import (gradient_of_a_marker, marker_device,
                                                markers_traced_with_gradients, traced_from_marker)
from harness.emulation.compiled_rng import HOST, example_input_places, places_of_nodes

# While a backend of eager ops compiles one of dynamo's graphs with transfers: whether any of its
# inputs is device memory (where a `to_traced_device` marker goes), and the list of the graphs
# rewritten so far; None otherwise.
_COMPILING: contextvars.ContextVar[tuple[bool, list] | None] = contextvars.ContextVar(
    "harness_aot_transfers", default=None)


@contextlib.contextmanager
def transfers_in_aot_graphs(on_device: bool | None) -> Iterator[list]:
    """Inside: AOTAutograd's training graphs get their markers as transfers (`on_device`, as
    above), or are left alone (None: inductor's compile, or a graph without transfers). Yields
    the forward graphs rewritten inside (empty: the compiled code runs no such graph)."""
    rewritten: list = []
    token = _COMPILING.set(None if on_device is None else (on_device, rewritten))
    try:
        yield rewritten
    finally:
        _COMPILING.reset(token)


def transfer(t: torch.Tensor, device: str) -> torch.Tensor:
    """A marker's transfer in one of AOTAutograd's graphs, run as the device's eager op."""
    return t.to(device)


def aot_transfers_patch() -> list[tuple[Any, str, Any]]:
    """(owner, name, replacement) for dynamo's `aot_autograd` backends: the call into
    AOTAutograd (`aot_module_simplified`, which every aot_autograd backend makes) traces the
    markers with gradients of their own, and its forward and backward compilers are handed
    graphs whose markers are transfers."""
    common = torch_internals.lazy_module("dynamo_backends_common")
    original = getattr(common, "aot_module_simplified", None)
    if original is None:
        return []

    def aot_module_simplified(*args, **kwargs):
        compiling = _COMPILING.get()
        if compiling is None:
            return original(*args, **kwargs)
        on_device, rewritten = compiling
        # where each marker's source lives, by the marker's sequence number: the backward sends
        # the marker's gradient there (filled as the forward compiles, read by the backward)
        sources: dict = {}
        places = example_input_places()
        for name in ("fw_compiler", "bw_compiler"):
            if kwargs.get(name) is not None:
                kwargs[name] = _with_transfers(kwargs[name], on_device, places, sources,
                                               rewritten if name == "fw_compiler" else None)
        with markers_traced_with_gradients():
            return original(*args, **kwargs)

    return [(common, "aot_module_simplified", aot_module_simplified)]


def _with_transfers(compiler: Callable, on_device: bool, places, sources: dict,
                    rewritten: list | None) -> Callable:
    def compile_with_transfers(gm, *args, **kwargs):
        if isinstance(gm, torch.fx.GraphModule):
            markers_as_transfers(gm, on_device, places if rewritten is not None else None,
                                 sources)
            if rewritten is not None:
                rewritten.append(gm)
        return compiler(gm, *args, **kwargs)

    # AOTAutograd reads what its compilers are (a wrapped backward compiler, a boxed one)
    for attribute in ("_is_wrapped_bw_compiler", "_boxed_call"):
        if hasattr(compiler, attribute):
            setattr(compile_with_transfers, attribute, getattr(compiler, attribute))
    return compile_with_transfers


def markers_as_transfers(gm: torch.fx.GraphModule, on_device: bool, places, sources: dict) -> None:
    """Each marker's alias in `gm` made the transfer it stands for, and each marker's gradient
    (the backward's alias) the transfer back to where the marker's source lives, as CUDA's
    `ToCopyBackward` copies it (see the module's docstring). `places`: the forward's primals'
    places (`inputs_of`), from which the forward notes in `sources` where each marker's source
    lives; None for the backward, which reads them."""
    alias = torch.ops.aten.alias.default
    place = places_of_nodes(gm, places) if places is not None else None
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not alias:
            continue
        if traced_from_marker(node):
            device = marker_device(node.meta["source_fn_stack"][-1][1])
            device = "cuda" if (on_device if device is None else device) else "cpu"
            source = node.args[0]
            if place is not None and isinstance(source, torch.fx.Node):
                where = place(source)
                if where is not None and "seq_nr" in node.meta:
                    sources[node.meta["seq_nr"]] = "cpu" if where == HOST else "cuda"
            if _factory_only_markers_read(source, alias):
                source.kwargs = {**source.kwargs, "device": torch.device(device)}
                node.replace_all_uses_with(source)
                gm.graph.erase_node(node)
            else:
                node.target, node.args = transfer, (source, device)
            changed = True
        elif gradient_of_a_marker(node):
            device = sources.get(node.meta.get("seq_nr"))
            if device is None:  # its source's place unknown: where the marker's copy came from
                marker = marker_device(node.meta["fwd_source_fn_stack"][-1][1])
                device = None if marker is None else "cpu" if marker else "cuda"
            if device is not None:
                node.target, node.args = transfer, (node.args[0], device)
                changed = True
    if changed:
        gm.recompile()


def _factory_only_markers_read(node: Any, alias: Any) -> bool:
    """A factory (a call naming a device and reading no tensor) whose value only markers of one
    device read: the trace made it on the cpu for them."""
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and "device" in node.kwargs and node.users):
        return False
    if any(isinstance(m.meta.get("val"), torch.Tensor) for m in node.all_input_nodes):
        return False
    markers = [user for user in node.users
               if user.op == "call_function" and user.target is alias and traced_from_marker(user)]
    return len(markers) == len(node.users) and len(
        {marker_device(user.meta["source_fn_stack"][-1][1]) for user in markers}) == 1
