"""Training through `torch.compile` on the emulated CUDA device: AOTAutograd's forward and backward.

When autograd must differentiate a compiled graph, AOTAutograd splits it into a forward graph and a
backward graph and hands each to inductor's `compile_fx_inner`; the forward runs inside an
`autograd.Function` whose backward runs the compiled backward. On CUDA, inductor wraps each of the
two in cudagraph trees under reduce-overhead (`CompiledFxGraph.current_callable` replaced by
`cudagraphify`): the forward is a node of the tree, its saved activations live in the trees' pool,
and the backward is a node of its own, replayed when autograd runs it.

The device does the same at the same seam: each forward or backward graph compiled for training
has its `current_callable` run as a `DeviceGraph` (compiled_graphs.py), which runs inductor's cpu
code with the placement mode off the stack, marks its results (the saved activations among them)
device memory, runs as one op under stream tracking or a capture, and, where inductor's
`triton.cudagraphs` was on when it compiled, is warmed up, captured and replayed as the trees do.
The dynamo graph around them is then no opaque graph of its own (`training_compiles` says so): it
runs AOTAutograd's wrappers as eager code, and the two graphs inside do the device's work.

An inference graph (`is_inference`) is left to the `DeviceGraph` of the whole dynamo graph, as
before, unless the dynamo graph takes a wrapper subclass (torchao's quantized weights): its
AOTAutograd wrapper unwraps the subclass before the inner graph runs, as CUDA's trees record the
inner graph of plain tensors, so that graph is the `DeviceGraph` there too (`wrapper_inputs`). AOTAutograd's cache is off inside the emulation: a hit rebuilds the compiled graphs from
inductor's cache without calling `compile_fx_inner`, so the backward would run unwrapped (inductor's
own FX graph cache still serves each graph).

Dynamo's `backend="cudagraphs"` wraps AOTAutograd's graphs in cudagraph trees itself, without
inductor: its training forward and backward run as DeviceGraphs alike
(`dynamo_cudagraphs_on_device`). Compiled autograd's graph of a backward takes its tensors boxed
(a list), which inductor flattens behind a wrapper before compiling: the flattened graph is the
DeviceGraph (`wrapper_inputs`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any, Callable

import torch

from harness import torch_internals

# the forward graphs compiled for training within one compile (see `training_compiles`)
_TRAINING: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "harness_training_compiles", default=None)
_WRAPPED = "_harness_device_inner_compile"
# whether the dynamo graph being compiled takes a wrapper subclass (see `wrapper_inputs`)
_WRAPPER_INPUTS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "harness_wrapper_inputs", default=False)


@contextlib.contextmanager
def wrapper_inputs(example_inputs):
    """Inside: an inference graph compiled for a dynamo graph whose example inputs include a
    wrapper subclass, or a list (compiled autograd's graph of a backward takes its tensors boxed,
    and inductor compiles a flattened graph of them behind a wrapper), runs as a `DeviceGraph` of
    its own, as a training forward does: the graph of plain tensors, which CUDA's trees record."""
    from harness.emulation.device_memory import is_wrapper_subclass

    found = any(is_wrapper_subclass(x) or isinstance(x, (list, tuple)) for x in example_inputs)
    token = _WRAPPER_INPUTS.set(found)
    try:
        yield
    finally:
        _WRAPPER_INPUTS.reset(token)


@contextlib.contextmanager
def training_compiles():
    """Collects the training forwards compiled inside: the list is non-empty when the graph being
    compiled runs through AOTAutograd's autograd.Function (its own DeviceGraph steps aside)."""
    found = _TRAINING.get()
    if found is not None:  # compile_fx inside dynamo's compile, or calling itself
        yield found
        return
    found = []
    token = _TRAINING.set(found)
    try:
        yield found
    finally:
        _TRAINING.reset(token)


def autograd_cache_off():
    """AOTAutograd's cache off (see the module's docstring); part of its config, so of its key."""
    config = torch_internals.lazy_module("functorch_config")
    if not hasattr(config, "enable_autograd_cache"):
        return contextlib.nullcontext()
    return config.patch(enable_autograd_cache=False)


def device_inner_compile(inner_compile: Callable, compiling: Callable,
                         device_graph: Callable) -> Callable:
    """`inner_compile` (inductor's `compile_fx_inner`, or what a caller passed to `compile_fx`)
    compiling under `compiling()` (torch's own CUDA answers, the device's modes off the stack: a
    backward AOTAutograd compiles lazily, at the first backward, runs outside `compile_fx`), with
    each training forward and each backward it returns run as
    `device_graph(compiled, graph_module, cudagraphs=..., static=...)` (compiled_graphs.py's
    DeviceGraph for one of AOTAutograd's graphs, called with inputs unboxed)."""
    if getattr(inner_compile, _WRAPPED, False):
        return inner_compile

    def compile_inner(gm, example_inputs, *args, **kwargs):
        from harness.emulation.active import emulation_active

        if emulation_active() != "cpu":
            return inner_compile(gm, example_inputs, *args, **kwargs)
        backward = bool(kwargs.get("is_backward", False))
        inference = kwargs.get("is_inference") is True
        own_graph = backward or kwargs.get("is_inference") is False or _WRAPPER_INPUTS.get()
        # inductor rewrites the graph it compiles (post-grad passes): the device reads a copy
        original = _copy_graph(gm) if own_graph and isinstance(gm, torch.fx.GraphModule) else None
        with compiling():
            compiled = inner_compile(gm, example_inputs, *args, **kwargs)
            # mode="reduce-overhead" patches inductor's config around this call, also for a
            # backward compiled lazily
            cudagraphs = bool(torch_internals.lazy_module("inductor_config").triton.cudagraphs)
        if original is None or getattr(compiled, "current_callable", None) is None:
            return compiled
        compiled.current_callable = BoxedGraph(device_graph(
            _unboxed(compiled.current_callable), original, cudagraphs=cudagraphs,
            static=kwargs.get("static_input_idxs") or (), backward=backward,
            inference=inference))
        found = _TRAINING.get()
        if found is not None and not backward:
            found.append(compiled.current_callable.graph)
        return compiled

    setattr(compile_inner, _WRAPPED, True)
    return compile_inner


def dynamo_cudagraphs_on_device(original: Callable, device_graph: Callable) -> Callable:
    """A replacement for dynamo's `backend="cudagraphs"` (`torch._dynamo.backends.cudagraphs.
    cudagraphs`, which its registered backend calls): AOTAutograd's graphs, each in cudagraph
    trees (`cudagraphify_impl` over the graph's ops run one by one), as the backend wraps them on
    CUDA. Compiling for the cpu the device's tensors are, the backend skips CUDA graphs ("cpu
    device") and hands AOTAutograd its graphs to run as plain code; here each training forward and
    backward runs as `device_graph(compiled, graph_module, static=..., backward=...)` (a
    DeviceGraph of its own, replayed through the trees, which decides the skips at its first
    call), with the forward's parameters and buffers static (`num_fw_fixed_arguments`) and the
    backward's saved activations (`count_tangents`). The skip for written inputs
    (`cudagraph_backend_support_input_mutation` off) is decided from the graph, as the backend
    decides it, with its log line; the graph and its backward then run as plain code. An
    inference graph is the dynamo graph's own DeviceGraph's, as before."""
    backends = torch_internals.lazy_module("dynamo_backends_cudagraphs")

    def cudagraphs(dynamo_model, dynamo_inputs):
        from harness.emulation.active import emulation_active
        from harness.emulation.compiled_devices import placement

        if emulation_active() != "cpu" or placement(dynamo_model, dynamo_inputs).host:
            # a graph with host work: the backend skips it ("cpu device", no graph partition),
            # and its graphs run as plain code, as on CUDA
            return original(dynamo_model, dynamo_inputs)
        dynamo_config = torch_internals.lazy_module("dynamo").config
        graphs_on = [True]  # the backend's `do_cudagraphs`: a skipped forward, a plain backward

        def forward(aot_model, aot_inputs, is_inference=False):
            fixed = backends.num_fw_fixed_arguments(len(dynamo_inputs), len(aot_inputs))
            # the one skip the backend decides from the graph alone, with its log line (the
            # device's graph counts it, and decides the others, at its first call)
            mutation = None if dynamo_config.cudagraph_backend_support_input_mutation else \
                backends.check_for_mutation_ignore_cuda_graph_managed_tensor(aot_model, fixed)
            if mutation:
                graphs_on[0] = False
                backends.log_cudagraph_skip_and_bump_counter(
                    f"skipping cudagraphs due to {mutation}")
            if is_inference or mutation:
                return backends.boxed_nop(aot_model, aot_inputs)
            # boxed_nop makes the graph's own code take its inputs boxed: the device reads a copy
            graph_module = _copy_graph(aot_model)
            interp = backends.boxed_nop(aot_model, aot_inputs)
            graph = BoxedGraph(device_graph(_unboxed(interp), graph_module, static=range(fixed)))
            found = _TRAINING.get()
            if found is not None:
                found.append(graph.graph)
            return graph

        def backward(aot_model, aot_inputs):
            if not graphs_on[0]:
                return aot_model
            graph_module = _copy_graph(aot_model)
            interp = backends.boxed_nop(aot_model, aot_inputs)
            return BoxedGraph(device_graph(_unboxed(interp), graph_module,
                                           static=range(backends.count_tangents(aot_model)),
                                           backward=True))

        return backends.aot_autograd(
            fw_compiler=forward, bw_compiler=backward,
            inference_compiler=functools.partial(forward, is_inference=True),
            keep_inference_input_mutations=dynamo_config.cudagraph_backend_keep_input_mutation,
        )(dynamo_model, dynamo_inputs)

    return cudagraphs


def _copy_graph(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    import copy

    return torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))


class BoxedGraph:
    """A DeviceGraph in inductor's boxed calling convention: one list of inputs, which the callee
    empties (AOTAutograd hands its saved tensors over so)."""

    _boxed_call = True

    def __init__(self, graph) -> None:
        self.graph = graph
        # on the instance too: dynamo's `disable` around a backward compiler's result (what
        # AOTAutograd calls) copies the callable's own attributes, not its class's
        self._boxed_call = True

    def __call__(self, args: list) -> Any:
        return self.graph.call_boxed(args)


def _unboxed(boxed: Callable) -> Callable:
    def call(*inputs):
        return boxed(list(inputs))

    return call
