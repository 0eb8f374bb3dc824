"""Activation checkpointing's random ops through AOTAutograd on the emulated CUDA device.

A random op inside a checkpointed region runs twice, in the forward and again when the backward
recomputes it, and must draw the same numbers both times. AOTAutograd's partitioner
(`functionalize_rng_ops`) wraps each such pair in operators that carry the generator state from
the forward to the backward, and picks them by the device of the op's traced value: on CUDA
`graphsafe_run_with_rng_state`, fed a clone of the device generator's state (safe in a CUDA graph),
on the cpu `run_and_save_rng_state` and `run_with_rng_state` around `torch.get_rng_state()`.

The device's tensors are cpu tensors, so dynamo and AOTAutograd trace cpu values and the
partitioner picked the cpu operators for device memory, and the random op, traced with the cpu
as its device (`rand_like(x)` decomposes to `rand(..., device=cpu)`), drew host memory from the
cpu's generator. Here the partitioner is told which random ops are device memory on CUDA, and
the graph names the device there, so it picks CUDA's operators and the op runs on the device.

Which ops are device memory follows from the graph's inputs (device memory or not, read from the
real tensors dynamo hands the backend) and from CUDA's rule that an op's tensors share a device:
the graph ran on CUDA, so a factory whose result meets device memory in an op was made on the
device. Transfers are traced into `aten.alias` (compiled_devices' markers) and join nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterator

import torch

from harness import torch_internals
from harness.emulation import device_indices
from harness.emulation.compiled_devices import gradient_of_a_marker, traced_from_marker
from harness.emulation.device_draws import EagerDraws
from harness.emulation.device_memory import is_device_memory
from harness.emulation.rules import cuda_index, names_cuda

# While a backend compiles one of dynamo's graphs: per example input, its device index when it is
# device memory, HOST when host memory, None when no tensor.
_INPUTS: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("harness_compiled_inputs",
                                                                       default=None)
# Whether the graphs name the device in their random ops (eager code, which runs them through the
# placement mode), or only the partitioner's choice changes (inductor: see compiled_for_the_host)
_NAMED: contextvars.ContextVar[bool] = contextvars.ContextVar("harness_compiled_named",
                                                              default=True)
HOST = "host"


@contextlib.contextmanager
def inputs_of(example_inputs) -> Iterator[None]:
    """Tells the partitioner, while a backend compiles, where dynamo's example inputs (the real
    tensors) live."""
    token = _INPUTS.set(tuple(
        (device_indices.index_of(a) if is_device_memory(a) else HOST)
        if isinstance(a, torch.Tensor) else None for a in example_inputs))
    try:
        yield
    finally:
        _INPUTS.reset(token)


@contextlib.contextmanager
def compiled_for_the_host() -> Iterator[None]:
    """While inductor compiles (compile_fx): its graphs are code for the cpu the device's tensors
    are, so their random ops keep the cpu as their device (inductor would write CUDA code for a
    value on cuda); the partitioner still picks CUDA's wrapper, which the code calls with the
    device generator's state (`register_draw_rules`)."""
    token = _NAMED.set(False)
    try:
        yield
    finally:
        _NAMED.reset(token)


def rng_ops_on_device(original: Callable) -> Callable:
    """A replacement for AOTAutograd's `functionalize_rng_ops(joint, fw, bw, num_sym_nodes)`: the
    random ops CUDA would run on the device name it, in the forward and backward graphs, and the
    partitioner sees their values on it (for its choice only: each value's device is put back)."""

    def functionalize_rng_ops(joint_module, fw_module, bw_module, *args, **kwargs):
        inputs = _INPUTS.get()
        devices = device_rng_ops(joint_module, inputs) if inputs is not None else {}
        if not devices:
            return original(joint_module, fw_module, bw_module, *args, **kwargs)
        moved = []
        for module in (fw_module, bw_module):
            for node in module.graph.nodes:
                if node.op != "call_function" or node.name not in devices:
                    continue
                device = torch.device("cuda", devices[node.name])
                if _NAMED.get() and isinstance(node.kwargs.get("device"), (str, torch.device)):
                    node.kwargs = {**node.kwargs, "device": device}
                value = node.meta.get("val")
                if torch_internals.is_fake_tensor(value):
                    moved.append((value, value.fake_device))
                    value.fake_device = device
        try:
            return original(joint_module, fw_module, bw_module, *args, **kwargs)
        finally:
            for value, device in moved:
                value.fake_device = device
            for module in (fw_module, bw_module):
                module.recompile()

    return functionalize_rng_ops


def device_rng_ops(joint_module: torch.fx.GraphModule, inputs: tuple) -> dict[str, int]:
    """The random ops of AOTAutograd's joint graph that are device memory on CUDA, by node name,
    with their device index: see the module's docstring. `inputs` are the example inputs' places
    (`inputs_of`), in the order of the graph's primals; a graph whose primals differ in number
    (a tensor subclass flattened, inputs merged) gets none."""
    place = places_of_nodes(joint_module, inputs)
    if place is None:
        return {}
    found = {}
    for node in joint_module.graph.nodes:
        if node.op == "call_function" and _is_random(node):
            where = place(node)
            if where is not None and where != HOST:
                found[node.name] = where
    return found


def places_of_nodes(module: torch.fx.GraphModule,
                    inputs: tuple | None) -> Callable[[torch.fx.Node], Any] | None:
    """Where CUDA keeps each value of one of AOTAutograd's graphs (a device index, HOST, or None
    where its group's members disagree or none is known), from its primals' places `inputs`
    (`inputs_of`) and CUDA's rule that an op's tensors share a device; None where the primals
    differ in number from `inputs`."""
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    primals = [n for n in placeholders if not n.name.startswith("tangents")]
    if inputs is None or len(primals) != len(inputs):
        return None
    groups = _Groups()
    for node, place in zip(primals, inputs):
        if place is not None:
            groups.know(node, place)
    for node in module.graph.nodes:
        if node.op != "call_function":
            continue
        for a, b in _same_device(node):
            groups.join(a, b)
    return groups.place


def example_input_places() -> tuple | None:
    """The places `inputs_of` gave, while a backend compiles; None elsewhere."""
    return _INPUTS.get()


# ops that take host tensors beside device tensors on CUDA (indices, copies' sources): only their
# first argument shares the result's device
_FIRST_ONLY = frozenset({torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default,
                         torch.ops.aten.index_put_.default, torch.ops.aten.copy_.default,
                         torch.ops.aten.copy.default, torch.ops.aten._unsafe_index.Tensor,
                         torch.ops.aten._unsafe_index_put.default})


def _same_device(node: torch.fx.Node) -> list[tuple[torch.fx.Node, torch.fx.Node]]:
    """Pairs of nodes whose values CUDA keeps on one device: an op's tensor arguments of one or
    more dimensions (0-dim host tensors pass as scalars) and its result."""
    if "device" in node.kwargs or traced_from_marker(node) or gradient_of_a_marker(node):
        return []  # a copy or factory naming its device, or a transfer (or its gradient)
    if node.target in _FIRST_ONLY:
        tensors = [node.args[0]] if node.args and isinstance(node.args[0], torch.fx.Node) else []
    else:
        tensors = [n for n in node.all_input_nodes if _dims(n)]
    return [(node, n) for n in tensors if _is_tensor(n)]


def _is_tensor(node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) or (
        isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in value))


def _dims(node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return value.dim() > 0
    return _is_tensor(node)


def _is_random(node: torch.fx.Node) -> bool:
    tags = getattr(node.target, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


class _Groups:
    """Union-find of nodes on one device, each group with the place its known members give (a
    device index or HOST); a group whose members disagree has none."""

    _MIXED = object()

    def __init__(self) -> None:
        self.parent: dict[Any, Any] = {}
        self.places: dict[Any, Any] = {}

    def root(self, node):
        parent = self.parent
        top = parent.setdefault(node, node)
        while parent[top] is not top:  # iterative: a graph's chains run thousands of ops deep
            top = parent[top]
        while node is not top:
            node, parent[node] = parent[node], top
        return top

    def know(self, node, place) -> None:
        root = self.root(node)
        self.places[root] = self._merge(self.places.get(root), place)

    def join(self, a, b) -> None:
        ra, rb = self.root(a), self.root(b)
        if ra is rb:
            return
        self.parent[rb] = ra
        self.places[ra] = self._merge(self.places.get(ra), self.places.pop(rb, None))

    def place(self, node):
        found = self.places.get(self.root(node))
        return None if found is self._MIXED else found

    def _merge(self, a, b):
        if a is None:
            return b
        if b is None or a == b:
            return a
        return self._MIXED


def hop_handlers(placement) -> dict:
    """The placement mode's handlers of the three wrappers, called by AOTAutograd's graphs as
    eager code (aot_eager's, a Python backward): see `_run_on_device`."""
    register_draw_rules()
    rng_prims = torch_internals.lazy_module("rng_prims")
    hops = [getattr(rng_prims, name, None) for name in
            ("graphsafe_run_with_rng_state", "run_and_save_rng_state", "run_with_rng_state")]

    def handler(func, args, kwargs):
        return _run_on_device(placement, func, args, kwargs)

    return {hop: handler for hop in hops if hop is not None}


def _run_on_device(placement, func, args: tuple, kwargs: dict):
    """A wrapper whose op works on device memory (a device tensor among its arguments, or a
    device named) dispatches with the placement mode on the function-mode stack, as any device
    call's body does not: its backend kernel reads the op's device from `x.device` or the
    `device` argument (CUDA's kernel, graph-safe or not, and the generator state it swaps in),
    and the op it runs is a device op, drawn from the device's generator. A dispatch mode with a
    rule for the wrapper still meets it first. A host op runs as torch runs it."""
    device = kwargs.get("device")
    on_device = (isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda"
                 or any(isinstance(t, torch.Tensor) and is_device_memory(t)
                        for t in torch_internals.tree_flatten((args, kwargs))[0]))
    if not on_device:
        return func(*args, **kwargs)
    keys = torch_internals.hop_compute_keyset(args, kwargs, func.non_fallthrough_keys)
    state = placement.state
    # The op runs under its device's guard on CUDA (the device it names, else its tensors'):
    # its kernel goes to that device's current stream, not the caller's current device's
    index = (cuda_index(device, state.current_index, state.properties.count)
             if names_cuda(device) else device_indices.guard_index(args, kwargs))
    with placement, state.device_guard(state.current_index if index is None else index):
        # its __call__ less the torch-function check, which would hand it back to this mode
        return func.dispatch(keys.highestPriorityTypeId(), *args, **kwargs)


_WRAPPERS = frozenset({"graphsafe_run_with_rng_state", "run_and_save_rng_state",
                       "run_with_rng_state"})


def call_higher_order(func, args: tuple, kwargs: dict):
    """A higher-order operator called from a device dispatch mode's handling (the stream
    tracking's), where torch functions are off: the random-op wrappers run with them back on, so
    the placement mode places them (`_run_on_device`); any other runs as it is."""
    if func.name() in _WRAPPERS:
        with torch_internals.EnableTorchFunction():
            return func(*args, **kwargs)
    return func(*args, **kwargs)


_rules_registered = False


def register_draw_rules() -> None:
    """The wrappers' rules under EagerDraws (device_draws.py), the mode under which the device's
    compiled code runs its random ops (done once per process): inductor's code for the cpu calls
    the wrapper itself, with its cpu buffers, and the op inside draws from the device's generator
    as CUDA's kernel of each wrapper does (`torch.cuda`'s state saved and restored, or the
    graph-safe state swapped in). Each rule runs only where EagerDraws is the mode met, that is on
    the device."""
    global _rules_registered
    if _rules_registered:
        return
    rng_prims = torch_internals.lazy_module("rng_prims")
    rules = {"graphsafe_run_with_rng_state": _graph_safe, "run_and_save_rng_state": _save_state,
             "run_with_rng_state": _with_state}
    for name, rule in rules.items():
        hop = getattr(rng_prims, name, None)
        if hop is not None:
            hop.py_impl(EagerDraws)(rule)
    _rules_registered = True


def _graph_safe(mode, op, *args, rng_state=None, **kwargs):
    generator = torch.cuda.default_generators[rng_state.device.index]
    current = generator.graphsafe_get_state()
    generator.graphsafe_set_state(rng_state)
    try:
        return mode.draw_call(op, args, kwargs)
    finally:
        generator.graphsafe_set_state(current)


def _save_state(mode, op, *args, **kwargs):
    return torch.cuda.get_rng_state(mode.index), mode.draw_call(op, args, kwargs)


def _with_state(mode, rng_state, op, *args, **kwargs):
    current = torch.cuda.get_rng_state(mode.index)
    torch.cuda.set_rng_state(rng_state.cpu(), mode.index)
    try:
        return mode.draw_call(op, args, kwargs)
    finally:
        torch.cuda.set_rng_state(current, mode.index)
