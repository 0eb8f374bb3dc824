"""Host and device memory through a `torch.compile`d graph on the emulated CUDA device.

Dynamo traces the cpu tensors under the device's tensors (its fakes are cpu tensors, so that
inductor writes cpu code; what `x.device` answers in the trace is compiled_device_reads.py's), and a
transfer between host and device is a no-op on cpu tensors: the placement mode traces
`.to("cuda")`, `.cuda()` and a factory naming cuda on the cpu (placement.py, `_traced_on_host`).
What a transfer means is kept in the graph instead: the traced call is wrapped in `to_device` or
`to_host`, identities that dynamo puts in the graph as nodes (allow_in_graph) and inductor compiles
to a view. When the graph runs, `output_marks` follows the memory of its inputs through its nodes
to each output, so the outputs are host or device memory as on CUDA: transformers' offloaded
static cache prefetches host keys to the device inside its compiled update.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from harness.emulation.device_memory import is_device_memory


# Set while a graph's own nodes run as the device's eager ops (DeviceGraph's calls autograd must
# differentiate through a backend of torch calls): there a marker is the transfer it stands for,
# since nothing follows the graph's memory afterwards but the marking of each op's result. The
# value says whether the graph runs on the device (any input in device memory), which is where a
# `to_traced_device` marker goes; None when no graph runs so.
_EAGER: contextvars.ContextVar[bool | None] = contextvars.ContextVar("harness_eager_transfers",
                                                                     default=None)


@contextlib.contextmanager
def transfers_run_eagerly(on_device: bool) -> Iterator[None]:
    token = _EAGER.set(on_device)
    try:
        yield
    finally:
        _EAGER.reset(token)


# Set while AOTAutograd traces one of dynamo's graphs for a backend of eager ops
# (compiled_aot_transfers.py): a marker traces as an alias with a gradient of its own, also an
# alias, so that the backward holds the reverse transfer CUDA's `ToCopyBackward` makes as a node
# (a plain alias's gradient is the incoming one itself).
_WITH_GRADIENT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "harness_markers_with_gradients", default=False)


@contextlib.contextmanager
def markers_traced_with_gradients() -> Iterator[None]:
    token = _WITH_GRADIENT.set(True)
    try:
        yield
    finally:
        _WITH_GRADIENT.reset(token)


class _TracedTransfer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return torch.ops.aten.alias(t)

    @staticmethod
    def backward(ctx, grad):
        return torch.ops.aten.alias(grad)


def _traced(t: torch.Tensor) -> torch.Tensor:
    """A marker's value in a trace: a view that is no transfer (`placement` follows the memory)."""
    if _WITH_GRADIENT.get():
        return _TracedTransfer.apply(t)
    return torch.ops.aten.alias(t)


def _eager() -> bool:
    return _EAGER.get() is not None and not torch.compiler.is_compiling()


def _resumed_sparse(t: torch.Tensor) -> bool:
    """A sparse tensor at a marker run as eager code outside any graph: dynamo cannot trace a
    sparse factory, and its graph break resumes the placement mode's traced call in the device's
    own frame, with the mode on the stack. `aten.alias` takes no sparse tensor ("Cannot access
    storage of SparseTensorImpl"): there the marker is the transfer."""
    return t.layout != torch.strided and not torch.compiler.is_compiling()


def to_device(t: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """A traced copy to the device: the tensor itself (the copy, if any, is made when the graph's
    output is handed back; see DeviceGraph)."""
    if _eager() or _resumed_sparse(t):
        return t.to("cuda", non_blocking=non_blocking)
    return _traced(t)


def to_host(t: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """A traced copy to the host, as `to_device`."""
    if _eager() or _resumed_sparse(t):
        return t.to("cpu", non_blocking=non_blocking)
    return _traced(t)


def to_traced_device(t: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """A traced transfer or factory given a `torch.device` that reads "cpu" in the trace: a host
    tensor's `.device`, or one dynamo read where compiled_device_reads.py cannot follow the value
    to real tensors (a higher-order op body's own arguments); resolved to the graph's device when
    it runs (see `placement`): a device object carries no mark of where it was read."""
    if _eager():
        return t.to("cuda" if _EAGER.get() else "cpu", non_blocking=non_blocking)
    if _resumed_sparse(t):
        return t  # the device it was given is a real tensor's, answered by the placement mode
    return _traced(t)


# Where each marker's result lives: True device, False host, None the graph's own device.
_MARKERS = {to_device: True, to_host: False, to_traced_device: None}
_registered = False


def register_markers() -> None:
    """Dynamo keeps the markers as graph nodes instead of inlining them (done once per process,
    when an emulation first enters: importing dynamo costs seconds)."""
    global _registered
    if not _registered:
        for marker in _MARKERS:
            torch.compiler.allow_in_graph(marker)
        _registered = True


def marker_device(marker) -> bool | None:
    """Where a marker's result lives: True the device, False the host, None the graph's own
    device (`to_traced_device`)."""
    return _MARKERS[marker]


def traced_from_marker(node: torch.fx.Node) -> bool:
    """Whether `node`, of a graph traced from dynamo's (AOTAutograd's aten graphs), is a marker's
    `aten.alias`: a transfer, not a view (fx keeps the dynamo call each node comes from)."""
    stack = node.meta.get("source_fn_stack")
    return bool(stack) and stack[-1][1] in _MARKERS


def gradient_of_a_marker(node: torch.fx.Node) -> bool:
    """Whether `node`, of AOTAutograd's backward, is the gradient of a marker traced with its
    gradient (`markers_traced_with_gradients`): a transfer back, not a view."""
    stack = node.meta.get("fwd_source_fn_stack")
    return (bool(stack) and "source_fn_stack" not in node.meta and node.op == "call_function"
            and node.target is torch.ops.aten.alias.default and _is_a_marker(stack[-1][1]))


def _is_a_marker(fn) -> bool:
    try:
        return fn in _MARKERS
    except TypeError:  # unhashable
        return False


def has_transfers(graph_module: torch.fx.GraphModule) -> bool:
    return any(is_marker(node) for node in graph_module.graph.nodes)


@dataclass(frozen=True)
class OutputMark:
    """Where one output of a graph lives on CUDA, and how a marker got it there."""

    device: bool
    non_blocking: bool = False


@dataclass(frozen=True)
class Placement:
    """Where a graph's values live for one set of input memories: an OutputMark (or None, for
    what is no tensor) per output, and the first host tensor of one or more dimensions it works on
    (inductor skips CUDA graphs for such a graph, naming it), or None; and the first 0-dim host
    input it uses, or None: inductor's `placeholder` counts the device of every input a node
    uses, so that without graph partition such an input is a cpu node too (with graph partition
    its mover copies it to the device first, compiled_partitions.py)."""

    outputs: tuple
    host: str | None
    host_scalar_input: str | None = None


def placement(graph_module: torch.fx.GraphModule, args) -> Placement:
    """The graph's Placement for these arguments (`memory_of_nodes`). The host tensor named, of
    one or more dimensions (a cpu scalar passes beside device tensors), is one inductor counts as
    a cpu node: an input the graph uses (inductor lets an unused one be), an attribute, or a value
    computed on the host that has elements (inductor leaves an empty cpu buffer out, so that a
    graph returning `torch.tensor([])` beside device work still gets CUDA graphs)."""
    marks = memory_of_nodes(graph_module, args)
    placeholders = iter(args)
    outputs: tuple = ()
    host = scalar_input = None
    for node in graph_module.graph.nodes:
        value = node.meta.get("example_value")
        if node.op == "placeholder":
            value = next(placeholders, None)
            if (scalar_input is None and isinstance(value, torch.Tensor) and not value.dim()
                    and node.users and node in marks and not marks[node].device):
                scalar_input = node.name
        elif node.op == "get_attr":
            value = graph_attribute(graph_module, node.target)
        elif node.op == "output":
            outs = node.args[0]
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            outputs = tuple(marks.get(o) if isinstance(o, torch.fx.Node) else None for o in outs)
            continue
        if (host is None and node in marks and not marks[node].device
                and isinstance(value, torch.Tensor) and value.dim() and not made_for_a_marker(node)
                and (node.users if node.op == "placeholder" else
                     node.op == "get_attr" or not _no_elements(value))):
            host = node.name
    return Placement(outputs, host, scalar_input)


def memory_of_nodes(graph_module: torch.fx.GraphModule, args) -> dict[torch.fx.Node, OutputMark]:
    """Where each node's value lives on CUDA for these arguments (nodes without a tensor among
    their inputs or values have none): `marks_of_nodes` with each input the memory it is."""
    inputs = dict(zip(graph_module.graph.find_nodes(op="placeholder"), args))

    def input_mark(node: torch.fx.Node) -> OutputMark | None:
        value = (inputs.get(node) if node.op == "placeholder"
                 else graph_attribute(graph_module, node.target))
        return OutputMark(is_device_memory(value)) if isinstance(value, torch.Tensor) else None

    on_device = any(isinstance(a, torch.Tensor) and is_device_memory(a) for a in args)
    return marks_of_nodes(graph_module.graph.nodes, input_mark, on_device)


def marks_of_nodes(nodes, input_mark, on_device: bool) -> dict[torch.fx.Node, OutputMark]:
    """Where each of `nodes` (in graph order) lives on CUDA, given `input_mark` of a placeholder
    or attribute node (None for what is no tensor) and whether the graph runs on the device.

    A marker's node is the memory it names; a call writing in place (a method ending in "_")
    returns its first argument's memory; any other call is device memory when one of its tensor
    arguments is (CUDA's ops run on their tensors' device; a factory that names cuda is wrapped in
    to_device), else host memory. A `to_traced_device` marker is device memory when the graph runs
    on the device: it stands for a `torch.device` reading cpu in the trace (the string "cpu" and
    `.cpu()` are `to_host`), most often one read from a tensor dynamo could not answer for
    (compiled_device_reads.py)."""
    marks: dict[torch.fx.Node, OutputMark] = {}
    for node in nodes:
        if node.op in ("placeholder", "get_attr"):
            mark = input_mark(node)
            if mark is not None:
                marks[node] = mark
        elif node.op == "output":
            continue
        elif is_marker(node):
            non_blocking = bool(node.args[1] if len(node.args) > 1
                                else node.kwargs.get("non_blocking", False))
            device = _MARKERS[node.target]
            marks[node] = OutputMark(on_device if device is None else device, non_blocking)
        else:
            inputs = [n for n in node.all_input_nodes if n in marks]
            if _in_place(node) and node.args and node.args[0] in marks:
                marks[node] = marks[node.args[0]]
            elif inputs or isinstance(node.meta.get("example_value"), torch.Tensor):
                marks[node] = OutputMark(any(marks[n].device for n in inputs),
                                         any(marks[n].non_blocking for n in inputs))
    return marks


def is_marker(node: torch.fx.Node) -> bool:
    """Whether `node` is a transfer marker of dynamo's graph (`to_device`, `to_host`,
    `to_traced_device`)."""
    return node.op == "call_function" and node.target in _MARKERS


def _no_elements(value: torch.Tensor) -> bool:
    numel = value.numel()
    return isinstance(numel, int) and numel == 0


def made_for_a_marker(node: torch.fx.Node) -> bool:
    """A value only markers use: a factory naming cuda, traced on the cpu and wrapped in its marker,
    lives where the marker says (the cpu tensor in the trace is the device's)."""
    return bool(node.users) and all(
        is_marker(user) for user in node.users)


def _in_place(node: torch.fx.Node) -> bool:
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    return isinstance(name, str) and name.endswith("_") and not name.endswith("__")


def graph_attribute(graph_module: torch.nn.Module, target: str) -> Any:
    value: Any = graph_module
    for name in target.split("."):
        value = getattr(value, name, None)
    return value
