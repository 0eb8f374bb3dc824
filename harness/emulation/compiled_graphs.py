"""`torch.compile` on the emulated CUDA device.

Device tensors are cpu tensors, so dynamo traces cpu tensors and inductor writes cpu (C++) code;
what the emulation adds is at the two ends of each compiled graph:

- **Compiling.** While a backend compiles a graph, `torch.cuda.is_available()` gives torch's own
  answer again: inductor asks it to pick Triton (which on a CUDA wheel without a GPU then fails on
  libcuda) and to build its pattern tables on "cuda" (which a CPU wheel cannot allocate). The code
  it writes is for the cpu the device tensors live on.
- **Running.** Every graph dynamo compiles while the emulation is active, whenever `torch.compile`
  was called, runs through `DeviceGraph`: with device tensors among its inputs it runs with the
  placement mode off the stack (inductor's wrapper allocates its buffers in C++, where no torch call
  shows) and its outputs are device memory. Inductor's kernels are C++ functions no dispatcher sees,
  so while stream tracking or a capture is on, the graph is called as one custom op
  (`harness_compiled::graph_N`) whose schema says which inputs it writes and whose fake kernel gives
  its outputs' shapes: the schedule runs it on the current stream once its inputs are ready, as any
  op, and a capture records it and runs it at each replay. An output aliasing an input is rebuilt
  after the op as a view of that input (views run for real; the op's schema says what it writes).
- **mode="reduce-overhead".** On a CUDA build of torch (with or without a GPU) each graph that
  gets CUDA graphs runs through torch's own cudagraph trees (`cudagraphify_impl`, as inductor
  wraps a graph it compiles for CUDA): their warm-ups run the compiled code with allocations
  routed to their pool, their recordings capture it as one op, and their calls into CUDA's
  allocator are answered by pool_checkpoints.py. The skips inductor decides at compile time for
  CUDA (cpu nodes, unsafe and data-dependent ops, written inputs) are decided here at a layout's
  first call, since the code is compiled for the cpu. On a build without the storage calls the
  trees need (a CPU wheel) each input layout is warmed up, captured and replayed by the device's
  stand-in for the trees, one recording per set of static-input addresses (a new cache
  re-records), with compiled_trees.py's generations around it; cuBLAS's workspaces are cleared
  around a warm-up and a recording, as the trees clear them. A graph with a data-dependent op
  (`.item()`, `nonzero()`) has no fixed output layout: it runs as host code outside a capture,
  without a CUDA graph under reduce-overhead, and is refused inside a capture. A graph with host
  work beside its device work is split as inductor's graph partition splits it
  (compiled_partitions.py): each partition of device work is a graph of its own through the
  trees, the host work runs between them; without graph partition it is skipped.
- **compile_fx and compile_fx_inner called by code itself** (a runtime's own backend, PyTorch's
  tests): compiled as dynamo's backends are here, and run as a `DeviceGraph` alike.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import itertools
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch

from harness import torch_internals, triton_internals
from harness.torch_internals import get_current_function_mode_stack as _get_current_function_mode_stack

from harness.emulation import compiled_kernels
from harness.emulation.compiled_aot_transfers import aot_transfers_patch, transfers_in_aot_graphs
from harness.emulation.compiled_capture_rules import FirstRefusal, Refusal, refuse
from harness.emulation.compiled_devices import (OutputMark, Placement, graph_attribute,
                                                has_transfers, placement, register_markers,
                                                transfers_run_eagerly)
from harness.emulation.compiled_partitions import partitions, partitions_apply
from harness.emulation.compiled_rng import compiled_for_the_host, inputs_of, rng_ops_on_device
from harness.emulation.compiled_stream_nodes import StreamOrderedGraph, compiled_afresh, taken_out
from harness.emulation.compiled_stream_pieces import StreamPieces, plan_of
from harness.emulation.compiled_trees import (direct_trees_refused, rerecord_limit_exceeded,
                                              trees_reset, wants_cudagraphs)
from harness.emulation.device_indices import guard_index
from harness.emulation.device_memory import is_device_memory, is_wrapper_subclass
from harness.emulation.traced_factories import factories_patch

# One library for every graph's op: torch.library keeps what it defines for the process.
_LIBRARY_NAME = "harness_compiled"
_COUNTER = itertools.count()
# Backends whose kernels no dispatcher sees: their graphs run as one op under tracking or capture.
# The others (eager, aot_eager, a runtime's own backend) run ops the recorder and the stream
# tracking see one by one; a backend of one's own that calls inductor on pieces wraps each piece
# in DeviceGraph(..., backend="inductor").
_OPAQUE_BACKENDS = frozenset({"inductor"})
# Backends whose AOTAutograd graphs for training run as DeviceGraphs of their own (their transfer
# markers stay views, placed with the graph's outputs): inductor's, dynamo's cudagraphs
# (compiled_training.py). The other backends of AOTAutograd run its graphs as the device's eager
# ops, with the markers made transfers (compiled_aot_transfers.py).
_DEVICE_GRAPH_BACKENDS = frozenset({"inductor", "cudagraphs"})


class CompiledGraphError(RuntimeError):
    """A compiled graph the emulated device cannot run as CUDA would (the message says why)."""


@dataclass(frozen=True)
class TensorLayout:
    size: tuple
    stride: tuple
    dtype: torch.dtype
    storage_offset: int

    @staticmethod
    def of(t: torch.Tensor) -> "TensorLayout":
        return TensorLayout(tuple(t.size()), tuple(t.stride()), t.dtype, t.storage_offset())


@dataclass(frozen=True)
class InputView:
    """An output that aliases input `index` (a mutated cache returned, a reshape of an input):
    rebuilt after the op as a view of that input, as CUDA returns the same memory."""

    index: int
    size: tuple
    stride: tuple
    storage_offset: int

    def of(self, args) -> torch.Tensor:
        return args[self.index].as_strided(self.size, self.stride, self.storage_offset)


@dataclass(frozen=True)
class OutputView:
    """An output aliasing another output of the graph (`x` and `x[0]`, both returned): rebuilt
    after the op as a view of that one, which the op returns, as CUDA returns one memory."""

    index: int  # the output it is a view of (one the op returns)
    size: tuple
    stride: tuple
    offset: int  # its storage offset less that output's

    def of(self, outputs: list) -> torch.Tensor:
        base = outputs[self.index]
        return base.as_strided(self.size, self.stride, base.storage_offset() + self.offset)


@dataclass(frozen=True)
class GraphCall:
    """What one compiled graph does for one input layout: its op and how to rebuild its result."""

    op: Any  # the OpOverload
    # per output: a TensorLayout (a fresh tensor the op returns), an InputView, an OutputView,
    # or the constant
    outputs: tuple
    # tuple or list, as the compiled graph returns; None for one value returned bare (inductor's
    # compile_fx called on a graph whose output is one tensor, as a runtime's own backend does)
    sequence: type | None
    # the graph's first op that CUDA refuses in a capture (a solver's info check, a fallback
    # kernel's copy from pageable memory: compiled_capture_rules.py), or None
    refusal: Refusal | None = None


def _library():
    lib = _LIBRARIES.get(_LIBRARY_NAME)
    if lib is None:
        lib = _LIBRARIES[_LIBRARY_NAME] = torch.library.Library(_LIBRARY_NAME, "FRAGMENT")
    return lib


_LIBRARIES: dict[str, Any] = {}


class DeviceGraph:
    """A compiled graph (the backend's callable) as the emulated device runs it."""

    def __init__(self, compiled: Callable, graph_module: torch.fx.GraphModule, backend: str,
                 cudagraphs: bool = False, bare_output: bool = False,
                 autograd_split: bool = False, aot_static: Any = None,
                 static: frozenset | None = None) -> None:
        self.compiled = compiled
        self.graph_module = graph_module
        # Compiled for training: AOTAutograd's forward and backward graphs inside run as
        # DeviceGraphs of their own (compiled_training.py), and this one runs its wrappers as
        # eager code around them.
        self.autograd_split = autograd_split
        # inductor's compile_fx of a graph returning one tensor returns it bare, and rewrites the
        # graph to return a list
        self.bare_output = bare_output
        self.opaque = backend in _OPAQUE_BACKENDS
        self.backend = backend
        self.calls: dict[tuple, GraphCall] = {}
        self.name = f"graph_{next(_COUNTER)}"
        # mode="reduce-overhead": each input layout is warmed up, captured and then replayed; a
        # layout keeps one recording per set of static-input addresses (see `_replayed`)
        self.cudagraphs = cudagraphs
        # what torch's trees are told of the graph (state.torchs_trees): one of AOTAutograd's
        # graphs for training (compiled_training.py), and its backward
        self.training = False
        self.backward = False
        self.returned: type = list  # what the compiled code returns (a list from inductor)
        # torch's trees' function of this graph per host thread: inductor's cudagraphify keeps
        # it thread-local, so each thread runs through its own thread's tree manager and pool
        # (a thread that ends lets go of its function, as its thread-local storage goes)
        self.trees_functions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # the device's stand-in for the trees: this graph as each host thread runs it
        # (`_this_threads`)
        self.per_thread: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.replays: dict[tuple, Any] = {}
        self.input_views: dict[tuple, tuple] = {}  # per layout: (output index, InputView)
        self.warm_generation: dict[tuple, Any] = {}  # the generation each layout warmed up in
        self.rerecords = 0  # recordings made because a static input's address changed
        self.output_traces = _output_traces(graph_module)  # for the trees' overwritten error
        self.skipped: list[str] = []  # why a layout ran without a graph, as inductor logs it
        # Layouts with host memory that inductor's graph partition would split (its cpu nodes
        # eager, the device partitions replayed): run here without a graph, and inductor counts
        # no skip for them, so they are listed apart.
        self.unpartitioned: list[str] = []
        # per layout split by graph partition: its pieces and the DeviceGraph running each
        self.pieces: dict[tuple, tuple] = {}
        # Calls of a backend whose graphs run op by op (aot_eager, dynamo's cudagraphs) that
        # autograd must differentiate: AOTAutograd's forward and backward run as eager ops, and
        # under CUDA graphs (backend="cudagraphs") without one, where CUDA replays each
        self.differentiated_op_by_op = 0
        # AOTAutograd's training graphs of this one hold its transfers (compiled_aot_transfers.py)
        self.aot_transfers = False
        # per layout, the inputs the graph writes that are not static: the trees let it write
        # one only where it is another recording's output (`triton.cudagraph_support_input_
        # mutation`), deciding at each call
        self.mutated_inputs: dict[tuple, frozenset] = {}
        # the trees' cache of one compiled graph's functions, by the ints among its inputs (its
        # dynamic sizes): past `triton.cudagraph_dynamic_shape_warn_limit` sizes they warn once
        self.int_keys: dict[Any, None] = {}
        self.warned_dynamic_shapes = False
        # cuBLAS on CUDA: each run reserves the thread's handle (blas_workspaces.py)
        from harness.emulation.blas_workspaces import uses_blas

        self.blas = uses_blas(graph_module)
        # whether the graph draws random numbers, which on CUDA come from the device's generator
        self.draws = _draws(graph_module)
        # whether the graph calls a kernel whose CPU and CUDA forms differ (compiled_kernels.py)
        self.device_kernels = compiled_kernels.in_graph(graph_module)
        # Host and device memory through the graph (compiled_devices.py): per input layout and
        # memory of the inputs, where each output lives.
        self.transfers = has_transfers(graph_module)
        self.placements: dict[tuple, Placement] = {}
        # the inputs that keep their address (dynamo marks them; compile_fx_inner is told them)
        self.static = static if static is not None else frozenset(
            i for i, node in enumerate(n for n in graph_module.graph.nodes if n.op == "placeholder")
            if node.meta.get("tensor_dict", {}).get("_dynamo_static_input_type") is not None)
        # One of AOTAutograd's forward or backward graphs for training (compiled_training.py):
        # its static inputs are AOTAutograd's (parameters and buffers of a forward, saved
        # activations of a backward, as inductor gives them to cudagraph trees), and its outputs
        # are device memory (the transfer markers are traced away into its aten ops)
        self.aot_graph = aot_static is not None
        if self.aot_graph:
            self.static = frozenset(aot_static)

    def __call__(self, *args):
        return self.call_boxed(list(args))

    def call_boxed(self, boxed: list):
        """The call in inductor's boxed convention: the caller's list is emptied, and the list
        the call holds is emptied in turn as torch's trees take the inputs of one of
        AOTAutograd's graphs (a backward's saved activations die while it runs, as the trees
        expect of a recording; see `_through_torchs_trees`)."""
        from harness.emulation.active import emulation_active

        args = list(boxed)
        boxed.clear()

        active = emulation_active()
        if active == "cuda" and self.opaque and _device_sees_calls() and any(
                isinstance(a, torch.Tensor) for a in args):
            from harness.emulation.active import active_state

            # The graph sanitizer's capture records what reaches the dispatcher; inductor's
            # Triton launches do not, so the piece is recorded as one op that replays it.
            return self._as_op(active_state(), args, _key(args))
        if active != "cpu" or not (self.transfers or any(
                isinstance(a, torch.Tensor) and is_device_memory(a) for a in args)):
            return self.compiled(*args)
        from harness.emulation.active import active_state

        state = active_state()
        if self.autograd_split:
            return self._placed(state, args, self.compiled(*args), _key(args))
        if not self.opaque and torch.is_grad_enabled() and any(
                isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            # AOTAutograd's graphs of such a backend are torch calls: with the placement mode on
            # they are the device's eager ops, their saved activations device memory for the
            # backward, which autograd's engine runs later, outside this call
            self.differentiated_op_by_op += 1
            if self.transfers and not self.aot_transfers:
                # a backend that runs dynamo's graph itself (eager): its markers are the
                # transfers they stand for when it runs as eager ops
                with transfers_run_eagerly(any(isinstance(a, torch.Tensor) and
                                               is_device_memory(a) for a in args)):
                    out = self.graph_module(*args)
                return self._placed(state, args, out, _key(args))
            return self._placed(state, args, self.compiled(*args), _key(args))
        if self.cudagraphs and not state.capturing():
            if state.torchs_trees:
                return self._through_torchs_trees(state, args)
            graph = self._this_threads()
            out = graph._replayed(state, args)
            state.trees.ran(graph)
            return out
        return self._run(state, args)

    def _this_threads(self) -> "DeviceGraph":
        """The graph whose recordings the calling thread's calls use: inductor's cudagraphify
        keeps its trees' function per host thread, each on that thread's tree manager with a
        pool of its own, so one thread's replays never rewrite what another's handed out. The
        first thread to run the graph uses this one; another gets a copy without recordings."""
        thread = threading.current_thread()
        graph = self.per_thread.get(thread)
        if graph is None:
            if not self.per_thread:
                graph = self
            else:
                graph = copy.copy(self)  # the compiled code, its analyses and its skip log shared
                graph.replays, graph.pieces, graph.warm_generation = {}, {}, {}
                graph.int_keys, graph.warned_dynamic_shapes, graph.rerecords = {}, False, 0
                graph.__dict__.pop("pool", None)
            self.per_thread[thread] = graph
        return graph

    # --- reduce-overhead through torch's own cudagraph trees (state.torchs_trees) -------------

    def _through_torchs_trees(self, state, args):
        """The layout's calls go to torch's cudagraph trees (`cudagraphify_impl`, as inductor's
        compile_fx wraps a graph it compiles for CUDA), whose model runs this graph: as the
        compiled code in a warm-up (its allocations routed to the trees' pool), as one op the
        device's capture records in a recording. The skips inductor decides for CUDA at compile
        time (cpu nodes, unsafe and data-dependent ops, written inputs) are the device's own, at
        the layout's first call."""
        key = _key(args)
        entry = self.replays.get(key)
        if entry is None and self._split(args, key):
            entry = self.replays[key]
        if entry is None:
            reason, partitioned = self._compile_time_skip(args, key)
            if reason is not None and self.backend == "cudagraphs" and key in self.mutated_inputs:
                # dynamo's backend logged this skip as it compiled the graph (its count went
                # with the ones compiling for the cpu made, see _torchs_own_cuda)
                torch_internals.lazy_module("dynamo_utils").counters["inductor"][
                    "cudagraph_skips"] += 1
                self.skipped.append("mutated inputs")
                self.replays[key] = "mutated inputs"
                return self._run(state, args)
            if reason is not None and partitioned:
                # inductor's graph partition would replay the parts around it, which the device
                # does not split off (symbolic shapes, a data-dependent op): the layout runs
                # without a graph, no skip counted
                return self._unpartitioned(state, args, key, reason)
            if reason is not None:
                return self._skip(state, args, key, reason)
            entry = self.replays[key] = "trees"
        if entry == "partitioned":
            return self._run_pieces(state, args, key)
        if entry != "trees":
            return self._run(state, args)
        thread = threading.current_thread()
        trees_function = self.trees_functions.get(thread)
        if trees_function is None:
            trees_function = self.trees_functions[thread] = self._trees_function(state, args, key)
            state.trees.note_graph(self)  # torch._dynamo.reset() lets go of the function
        # held weakly: a backward's static inputs are the activations it saved, which the trees
        # expect to die while it runs (a recording notes which of its parent's outputs did)
        static = [weakref.ref(args[i]) for i in self.static
                  if i < len(args) and isinstance(args[i], torch.Tensor)]
        state.trees_static_inputs = lambda: [
            t.untyped_storage() for t in (ref() for ref in static) if t is not None]
        inputs = list(args)
        if self.aot_graph:
            # AOTAutograd hands its inputs over (boxed): nothing here keeps them past the trees
            args.clear()
        try:
            outs = trees_function(inputs)
        finally:
            state.trees_static_inputs = None
        out = outs[0] if self.bare_output or not issubclass(self.returned, (list, tuple)) \
            else self.returned(outs)
        # the trees wrap the whole compiled call here (but for AOTAutograd's own graphs),
        # AOTAutograd's runtime around the graph included, where inductor wraps the graph inside
        # it: an output aliasing an input is rebuilt from the caller's tensor as AOTAutograd does
        return self._from_inputs(args, key, out)

    def _trees_function(self, state, args, key):
        """torch's trees' function of this graph (one for its layouts: the trees record one per
        set of its int inputs, and warn past a limit of them)."""

        def model(inputs):
            call = list(inputs)
            inputs.clear()
            out = self._run(state, call)
            self.returned = type(out)
            return list(out) if isinstance(out, (list, tuple)) else [out]

        utils = torch_internals.lazy_module("inductor_cudagraph_utils")
        # the user's line that writes each input, as inductor finds it in its post-grad graph
        # (the device's graph is dynamo's, whose in-place calls inductor's helper does not see)
        placeholders = tuple(
            dataclasses.replace(info, mutating_use_stack_trace=(
                info.mutating_use_stack_trace or _mutating_use_trace(self.graph_module, [i])))
            for i, info in enumerate(utils.get_placeholder_info(self.graph_module.graph)))
        # the trees of the graph's device, as inductor picks them from the devices it compiled
        # for: its inputs may be on another device than the current one (`cuda:1` tensors called
        # with cuda:0 current), and the trees route that device's allocations to its pool
        device = guard_index(args, {})
        return torch_internals.lazy_module("inductor_cudagraph_trees").cudagraphify_impl(
            model, list(args), sorted(self.static),
            device_index=torch.cuda.current_device() if device is None else device,
            is_backward=self.backward, is_inference=not self.training,
            stack_traces=self.output_traces, placeholders=placeholders,
            constants=_graph_constants(self.graph_module),
            mutated_input_idxs=tuple(sorted(self.mutated_inputs.get(key, ()))))

    def _compile_time_skip(self, args, key) -> tuple[str | None, bool]:
        """Why inductor would compile this layout without CUDA graphs (its reason, as it logs it),
        or None; and whether its graph partition (on by default) would replay the rest."""
        partition = partitions_apply(self.backend)
        placed = self._placement(args, key)
        host = placed.host if partition else placed.host or placed.host_scalar_input
        if host is not None:
            return self._cpu_device_reason(host, partition), partition
        symbolic = _symbolic_shapes_skip(self.graph_module)
        if symbolic is not None:
            return symbolic, partition
        unsafe = _cudagraph_unsafe_op(self.graph_module)
        if unsafe is not None:
            return (f"cudagraph-unsafe op {unsafe}" if partition
                    else f"disabling cudagraphs due to incompatible op {unsafe}"), partition
        try:
            mutated = _analyse(self.graph_module, args)[0]
        except _data_dependent_errors():
            return ("data-dependent op" if partition
                    else "incompatible op (data-dependent)"), partition
        if mutated - self.static:
            if self.backend == "cudagraphs":
                supported = torch_internals.lazy_module(
                    "dynamo").config.cudagraph_backend_support_input_mutation
            else:
                supported = torch_internals.lazy_module(
                    "inductor_config").triton.cudagraph_support_input_mutation
            self.mutated_inputs[key] = frozenset(mutated - self.static)
            if not supported:
                return self._mutation_reason(sorted(mutated - self.static)), False
        return None, False

    # --- mode="reduce-overhead" ------------------------------------------------------------

    def _replayed(self, state, args):
        """cudagraph trees' life of one input layout: the first call runs as compiled (the warm-up),
        the second captures the graph into the graph's pool and replays it (capture runs nothing), later calls copy the
        inputs that are not static (parameters, buffers, marked static addresses) into the
        captured ones and replay. Outputs in the pool are handed out as the trees hand them out
        (see `_recorded`): the replays' are the same tensors each time, rewritten by the next."""
        key = _key(args)
        entry = self.replays.get(key)
        if entry is None and self._split(args, key):
            entry = self.replays[key]
        if entry == "partitioned":
            # the partitions are the trees' functions, not this graph (no generation entered)
            return self._run_pieces(state, args, key)
        generation = state.trees.enter(self, state.memory)
        # The trees' path within a generation: a graph run again in one generation (one step
        # between cudagraph_mark_step_begin calls, or one top-level call) is another node of the
        # tree, recorded apart with memory of its own, not a replay over the first one's outputs.
        position = state.trees.position(self, key)
        if entry is None:
            placed = self._placement(args, key)
            host = placed.host
            if host is not None:
                # inductor's check_multiple_devices_or_any_cpu_nodes: decided at compile time
                if partitions_apply(self.backend):  # no device work to split off
                    return self._unpartitioned(state, args, key, f"cpu device ({host})")
                return self._skip(state, args, key, self._cpu_device_reason(host, False))
            if placed.host_scalar_input is not None and not partitions_apply(self.backend):
                # a 0-dim host input is a cpu node of inductor's graph too (`placeholder`)
                return self._skip(state, args, key,
                                  self._cpu_device_reason(placed.host_scalar_input, False))
            symbolic = _symbolic_shapes_skip(self.graph_module)
            if symbolic is not None:
                if partitions_apply(self.backend):
                    return self._unpartitioned(state, args, key, symbolic)
                return self._skip(state, args, key, symbolic)
            # What inductor and the trees decide before the first run (at compile time, or as
            # the trees first run the function): `triton.cudagraph_or_error` raises there.
            unsafe = _cudagraph_unsafe_op(self.graph_module)
            if unsafe is not None:
                # an op tagged cudagraph_unsafe: with graph partition inductor runs it between
                # the replayed partitions (split off above, unless there is nothing else)
                if partitions_apply(self.backend):
                    return self._unpartitioned(state, args, key, f"cudagraph-unsafe op {unsafe}")
                return self._skip(state, args, key,
                                  f"disabling cudagraphs due to incompatible op {unsafe}")
            try:
                mutated = _analyse(self.graph_module, args)[0]
            except _data_dependent_errors():
                # inductor's incompatible ops (`.item()`, `nonzero()`): with graph partition CUDA
                # replays the partitions around them, which the device cannot split off
                if partitions_apply(self.backend):
                    return self._unpartitioned(state, args, key, "data-dependent op")
                return self._skip(state, args, key, "incompatible op (data-dependent)")
            if mutated - self.static:
                if self.backend == "cudagraphs" and not torch_internals.lazy_module(
                        "dynamo").config.cudagraph_backend_support_input_mutation:
                    # dynamo's backend logged this skip as it compiled the graph (its count
                    # went with the ones compiling for the cpu made, see _torchs_own_cuda)
                    torch_internals.lazy_module("dynamo_utils").counters["inductor"][
                        "cudagraph_skips"] += 1
                    self.skipped.append("mutated inputs")
                    self.replays[key] = "mutated inputs"
                    return self._run(state, args)
                if self.backend != "cudagraphs" and not torch_internals.lazy_module(
                        "inductor_config").triton.cudagraph_support_input_mutation:
                    return self._skip(state, args, key,
                                      self._mutation_reason(sorted(mutated - self.static)))
                self.mutated_inputs[key] = frozenset(mutated - self.static)
            self._note_sizes(args)
            self.replays[key] = "warm"
            self.warm_generation[key] = generation
            if self._writes_an_input_of_its_own(state, args, key):
                return self._run(state, args)
            return self._warm_up(state, args)
        if self._writes_an_input_of_its_own(state, args, key):
            return self._run(state, args)
        if isinstance(entry, str):
            if entry != "warm":  # skipped, for the reason kept
                return self._run(state, args)
            if self.warm_generation.get(key) == generation:
                # the trees stay in warm-up for the rest of the generation it began in
                return self._warm_up(state, args)
            entry = self.replays[key] = [_Replay.capture(self, state, args, position)]
            return self._from_inputs(
                args, key, self._recorded(state, args, entry[0].replay(args, state.trees)))
        trees = state.trees
        if (trees.node, trees.function_id(self)) in trees.eager:
            return self._run(state, args)  # past the re-recording limit under this node
        addresses = _static_addresses(args, self.static)
        for recorded in entry:
            if (recorded.static_addresses == addresses and recorded.position == position
                    and recorded.managed_addresses == _addresses(args, recorded.managed)):
                out = recorded.replay(args, state.trees)
                if recorded.handed is None:  # trees hand out the same tensors every replay
                    # over the pool without blocks of their own (their cached tensors' storages
                    # are built from the pool's pointers; a block goes back to a storage only
                    # when the trees checkpoint the allocator's state for a later recording)
                    recorded.handed = self._aliased(state, args, out, owned=False)
                    state.trees.note_managed(self._pool_outputs(args, recorded.handed)[0])
                return self._from_inputs(args, key, recorded.handed)
        if any(recorded.static_addresses == addresses and recorded.position == position
               for recorded in entry):
            # An input that was an output of a recording (a "cudagraph managed" tensor, read by
            # address) is another tensor now: the trees record again under this node, up to
            # their limit, past which the function runs without a graph there.
            limit = torch_internals.lazy_module("inductor_config").triton \
                .cudagraph_unexpected_rerecord_limit
            if rerecord_limit_exceeded(trees.rerecord(self), static_input_moved=False):
                trees.eager.add((trees.node, trees.function_id(self)))
                node = "None" if trees.node is None else trees.node
                _log_skip(f"skipping cudagraph due to function {trees.function_id(self)} exceeding "
                          f"max re-recording limit (={limit}) on cudagraph node {node} due to "
                          f"cudagraph managed tensor data pointer changed.")
                return self._run(state, args)
            entry.append(_Replay.capture(self, state, args, position))
            return self._from_inputs(
                args, key, self._recorded(state, args, entry[-1].replay(args, state.trees)))
        if any(recorded.static_addresses == addresses for recorded in entry):
            entry.append(_Replay.capture(self, state, args, position))  # a new node, no re-record
            return self._from_inputs(
                args, key, self._recorded(state, args, entry[-1].replay(args, state.trees)))
        # A static input (a parameter, a marked cache buffer) at a new address: the recordings
        # read and write the old one, so cudagraph trees record again, up to their limit where
        # this torch's trees count such moves (from 2.13 they do not).
        self.rerecords += 1
        limit = torch_internals.lazy_module("inductor_config").triton.cudagraph_unexpected_rerecord_limit
        if rerecord_limit_exceeded(self.rerecords, static_input_moved=True):
            return self._skip(state, args, key,
                              f"exceeding max re-recording limit (={limit}) due to static input "
                              f"data pointer changed")
        entry.append(_Replay.capture(self, state, args, position))
        return self._from_inputs(
            args, key, self._recorded(state, args, entry[-1].replay(args, state.trees)))

    def _note_sizes(self, args) -> None:
        """The trees record a function per set of int inputs (`cudagraphify_impl`'s cache) and,
        at a new one past the warn limit, log their dynamic-shape warning once per graph."""
        ints = tuple(a for a in args if isinstance(a, int) and not isinstance(a, bool))
        int_key = (ints if len(ints) > 1 else ints[0]) if ints else None
        if int_key in self.int_keys:
            return
        if not self.warned_dynamic_shapes:
            utils = torch_internals.lazy_module("inductor_cudagraph_utils")
            warn = getattr(utils, "maybe_warning_due_to_dynamic_shape", None)
            if warn is not None:
                self.warned_dynamic_shapes = bool(warn(self.int_keys, int_key))
        self.int_keys[int_key] = None

    def _from_inputs(self, args, key, out):
        """`out` with each output that aliases an input rebuilt as a view of this call's input:
        AOTAutograd regenerates such outputs from the caller's tensors around the compiled code
        (what autograd records, and CUDA's memory), where a recording's are views of the copies
        it reads its inputs from. One of AOTAutograd's own graphs (training) runs inside its
        runtime, which does that itself, as inductor's graph does under the trees: its outputs
        stay the recording's. Those are the activations the backward saves, a forward input
        among them (`x` of `x * w`), which the trees give the backward at the address of the
        recording's copy, the same at every replay; rebuilt from the caller's `x`, a new tensor
        each step, the backward's static input moved at each step and was recorded again."""
        if self.aot_graph:
            return out
        views = self.input_views.get(key)
        if views is None:
            try:
                outputs = _analyse(self.graph_module, args)[1]
            except _data_dependent_errors():
                outputs = ()
            views = self.input_views[key] = tuple(
                (i, o) for i, o in enumerate(outputs) if isinstance(o, InputView))
        if not views:
            return out
        outs = _outputs_of(out)
        for i, view in views:
            if i < len(outs):
                outs[i] = view.of(args)
        return _as_returned(outs, out)

    def _writes_an_input_of_its_own(self, state, args, key) -> bool:
        """The trees' check at each call of a graph that writes inputs: one that is not another
        recording's (or warm-up's) output runs the graph without a CUDA graph, the skip logged
        once per function."""
        written = [i for i in sorted(self.mutated_inputs.get(key, ()))
                   if not state.trees.is_managed(args[i])]
        if written and state.trees.warn_mutation(self):
            _log_skip(f"skipping cudagraphs due to {self._mutation_reason(written)}")
        return bool(written)

    def _mutation_reason(self, indices: list) -> str:
        trace = _mutating_use_trace(self.graph_module, indices)
        return f"mutated inputs ({len(indices)} instances)" + (
            f". Found from : \n {trace}" if trace else "")

    def pool_handle(self):
        """The graph pool this graph's warm-ups allocate from and its recordings capture into
        (the trees keep one per device; each graph has its own here)."""
        if not hasattr(self, "pool"):
            self.pool = torch.cuda.graph_pool_handle()
        return self.pool

    def _warm_up(self, state, args):
        # what a warm-up returns is memory of the trees' graph pool
        with _cublas_cleared(state), state.trees.warming_up(state.memory):
            out = self._run(state, args)
        self._note_in_pool(state, args, out)
        return out

    def _note_in_pool(self, state, args, out) -> None:
        """The trees keep a warm-up's or a recording's outputs in their pool: the next generation
        makes them raise, and a later graph on the path reads them where they are (managed)."""
        pooled = self._pool_outputs(args, out)
        state.trees.note_pool_outputs(*pooled)
        state.trees.note_managed(pooled[0])

    def _pool_outputs(self, args, out) -> tuple[list, list]:
        """The outputs in the trees' pool (fresh device tensors, not views of an input), with the
        stack trace of the line that made each, as the trees keep them for their error."""
        outs = _outputs_of(out)
        # the graph's inputs, and its attributes (a parameter read with get_attr, which
        # inductor's freezing returns as a constant): memory of the program, not of the pool
        inputs = [a for a in args if isinstance(a, torch.Tensor)] + [
            a for a in (graph_attribute(self.graph_module, n.target)
                        for n in self.graph_module.graph.nodes if n.op == "get_attr")
            if isinstance(a, torch.Tensor)]
        pooled, traces = [], []
        for i, t in enumerate(outs):
            if (isinstance(t, torch.Tensor) and is_device_memory(t) and not is_wrapper_subclass(t)
                    and t.untyped_storage().nbytes() and not _shares_memory(t, inputs)):
                pooled.append(t)
                traces.append(self.output_traces[i] if i < len(self.output_traces) else None)
        return pooled, traces

    def _recorded(self, state, args, out):
        """A recording's result: the trees hand out its outputs over the pool's memory as
        tensors of their own, which the next generation makes raise; the replays hand out one
        other set, the same tensors every replay, rewritten by each."""
        handed = self._aliased(state, args, out)
        self._note_in_pool(state, args, handed)
        return handed

    def _aliased(self, state, args, out, owned: bool = True):
        """`out` with each output in the pool replaced by a tensor of its own over the same
        memory, as the trees build their outputs from the pool's pointers. `owned` (a
        recording's outputs): each new storage holds its block of the pool while the program
        holds it, as the capture's own tensors do on CUDA, not the recording."""
        pooled = {id(t) for t in self._pool_outputs(args, out)[0]}
        outs = _outputs_of(out)
        aliases: dict = {}  # outputs sharing a storage share one alias storage, as trees build them
        for i, t in enumerate(outs):
            if id(t) in pooled:
                outs[i] = _pool_alias(state, t, aliases)
        if owned and aliases:
            # what the allocator's model keys the recordings' pool by; the blocks are the
            # capture's, made on the trees' stream
            pool_id, arena = state.pool_handles.arena(self.pool_handle())
            with torch.cuda.stream(state.trees.capture_stream()):
                for alias in aliases.values():
                    state.memory.adopt_in_pool(alias, arena, pool_id)
        return _as_returned(outs, out)

    def release_recordings(self) -> None:
        """Forget every layout's warm-up, recordings and skips (the graphs and their pool go with
        them), as `torch._dynamo.reset()` shuts cudagraph trees down: a later call warms up
        again."""
        self.replays.clear()
        self.pieces.clear()
        self.warm_generation.clear()
        self.rerecords = 0
        self.skipped.clear()
        self.int_keys.clear()
        self.warned_dynamic_shapes = False
        self.__dict__.pop("pool", None)
        self.trees_functions.clear()  # bound to the trees' managers that were shut down

    def _split(self, args, key) -> bool:
        """Whether inductor's graph partition splits this layout (compiled_partitions.py: nodes
        CUDA graphs cannot hold beside device work), decided at its first call: then its pieces
        of device work run through CUDA graphs, each a function of the trees of its own, and the
        nodes between them as host code (`_run_pieces`). Inductor leaves nodes of symbolic
        shapes out of its partitions under `triton.cudagraph_skip_dynamic_graphs`, which the
        device does not split off (the layout runs without a graph)."""
        if (self.aot_graph or not partitions_apply(self.backend)
                or _symbolic_shapes_skip(self.graph_module)):
            return False  # AOTAutograd's graphs for training are device work (`_placement`)
        partitioned = partitions(self.graph_module, args, self.static)
        if partitioned is None or not any(piece.cudagraphable for piece in partitioned.pieces):
            return False  # nothing to split, or no partition (decided as a skip's reason)
        self.pieces[key] = (partitioned, tuple(
            DeviceGraph(piece.module, piece.module, self.backend,
                        cudagraphs=piece.cudagraphable, static=piece.static)
            for piece in partitioned.pieces))
        self.replays[key] = "partitioned"
        return True

    def _run_pieces(self, state, args, key):
        """The whole graph's result from its pieces' (`_split`), run in their order."""
        partitioned, graphs = self.pieces[key]
        nodes = partitioned.module.graph.nodes
        values: dict = dict(zip((n for n in nodes if n.op == "placeholder"), args))
        # inductor's wrapper frees a partition's buffer after its last reader, as the trees see
        # it: a recording whose outputs are all dead by the next piece's call ends its path there
        result = next(n for n in nodes if n.op == "output").args[0]
        returned: set = set()
        torch.fx.map_arg(result, returned.add)
        last_reader = {n: i for i, piece in enumerate(partitioned.pieces) for n in piece.inputs}
        for i, (piece, graph) in enumerate(zip(partitioned.pieces, graphs)):
            values.update(zip(piece.outputs, graph(*(values[n] for n in piece.inputs))))
            for n in piece.inputs:
                if last_reader[n] == i and n not in returned and n.op != "placeholder":
                    del values[n]

        def value(node):
            if node.op == "get_attr":
                return graph_attribute(partitioned.module, node.target)
            return values[node]

        if isinstance(result, torch.fx.Node):
            return value(result)
        return type(result)(value(o) if isinstance(o, torch.fx.Node) else o for o in result)

    def _cpu_device_reason(self, host: str, partition: bool) -> str:
        """Inductor's reason to skip CUDA graphs for a graph with the cpu node `host`, with the
        user's line that reads it (`check_multiple_devices_or_any_cpu_nodes`); with graph
        partition, the node the graph is split at."""
        if partition:
            return f"cpu device ({host})"
        node = next((n for n in self.graph_module.graph.nodes if n.name == host), None)
        trace = next((_users_frames(user.meta.get("stack_trace")) for user in
                      (node.users if node is not None else ())
                      if user.meta.get("stack_trace")), None)
        return f"cpu device ({host})" + (f". Found from : \n {trace}" if trace else "")

    def _unpartitioned(self, state, args, key, reason: str):
        """This layout runs without a graph from now on, where inductor's graph partition would
        replay the parts around `reason` (the device cannot split a compiled graph): no skip is
        counted, as inductor counts none."""
        self.replays[key] = "unpartitioned"
        self.unpartitioned.append(reason)
        return self._run(state, args)

    def _skip(self, state, args, key, reason: str):
        """This layout runs without a graph from now on, as cudagraph trees skip it: inductor's
        skip is logged and counted, and raised under `triton.cudagraph_or_error`."""
        _log_skip(f"skipping cudagraphs due to {reason}")
        self.skipped.append(reason)
        self.replays[key] = reason
        return self._run(state, args)

    def _placement(self, args, key: tuple) -> Placement:
        """Where the outputs of the layout `key` (`_key(args)`) live, for these inputs' memory."""
        if self.aot_graph:
            device = any(isinstance(a, torch.Tensor) and is_device_memory(a) for a in args)
            return Placement((OutputMark(True) if device else None,) * len(self.output_traces),
                             None)
        key = (key, tuple(is_device_memory(a) for a in args if isinstance(a, torch.Tensor)))
        found = self.placements.get(key)
        if found is None:
            found = self.placements[key] = placement(self.graph_module, args)
        return found

    def _run(self, state, args):
        if self.blas:
            state.blas_workspaces.note_call(state.streams.current(), f"compiled {self.name}")
        # A graph reading host memory beside device memory (one that copies between them), or
        # one without tensor inputs (a factory), runs as host code: as one device op its host
        # inputs would be a mixed-device call, and an op without tensors has no kernel to pick.
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        host_inputs = any(a.dim() and not is_device_memory(a) for a in tensors)
        # A wrapper subclass among the inputs (torchao's weights): the compiled code unwraps it
        # (AOTAutograd's subclass wrapper), which an op of plain tensors would have done first,
        # so the code runs as it is and its inner graph is the device op.
        wrappers = any(is_wrapper_subclass(a) for a in tensors)
        key = _key(args)
        data_dependent = self.calls.get(key, False) is None
        if self.opaque and tensors and not host_inputs and not wrappers and not data_dependent and (
                state.streams_tracking is not None or state.capturing()) and _device_sees_calls():
            try:
                out = self._as_op(state, args, key)
            except _data_dependent_errors() as error:
                # `.item()`, `nonzero()`, ... inside the graph: no fixed output layout for an
                # op's fake kernel to give. Outside a capture it runs as host code, untracked.
                if state.capturing():
                    raise CompiledGraphError(
                        f"a compiled graph ({self.name}) with a data-dependent op "
                        f"({type(error).__name__}: {str(error).splitlines()[0][:120]}) inside a "
                        f"capture on the emulated CUDA device: its outputs' shapes depend on "
                        f"values the capture cannot read (CUDA refuses the host sync it needs); "
                        f"move that op out of the captured region") from error
                self.calls[key] = None
                return self._run(state, args)
        else:
            with _on_device(state, self._placement(args, key).host is None), \
                    _device_draws(state, self.draws), _device_kernels(self.device_kernels):
                out = self.compiled(*args)
        return self._placed(state, args, out, key)

    def _placed(self, state, args, out, key: tuple):
        """The outputs in the memory CUDA gives them: device memory where the graph's path from
        its inputs runs on the device, host memory where it ends in a copy to the host. An output
        the compiled code left in the other memory (a transfer is a view in the graph) is copied
        there, as the transfer does."""
        marks = self._placement(args, key).outputs
        outs = _outputs_of(out)
        for i, t in enumerate(outs):
            mark = marks[i] if i < len(marks) else None
            if not isinstance(t, torch.Tensor) or mark is None:
                continue
            if is_wrapper_subclass(t):
                if mark.device:  # a wrapper subclass the code made: the tensors it holds
                    state.memory.mark_device(t)
                continue
            inputs = [a for a in args if isinstance(a, torch.Tensor)]
            if mark.device and not is_device_memory(t):
                if _shares_memory(t, inputs):
                    outs[i] = t.to("cuda", non_blocking=mark.non_blocking)
                else:
                    state.memory.mark_device(t)
            elif not mark.device and is_device_memory(t) and not t.numel():
                # an empty tensor the graph made on the host (inductor's code made it with the
                # rest, inside a capture too): nothing to copy
                outs[i] = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="cpu")
            elif not mark.device and is_device_memory(t):
                outs[i] = t.to("cpu", non_blocking=mark.non_blocking)
        return _as_returned(outs, out)

    # --- one op per input layout -------------------------------------------------------------

    def _as_op(self, state, args, key: tuple):
        # Inputs that require grad here are no refusal: a graph autograd differentiates runs
        # AOTAutograd's forward and backward as graphs of their own (compiled_training.py), and
        # one AOTAutograd compiled for inference returns nothing that needs a backward (an alias
        # of an input is rebuilt outside the op, as a view autograd records).
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        call = self.calls.get(key)
        if call is None:
            call = self.calls[key] = self._define(state, args)
        if call.refusal is not None and state.capturing():
            refuse(state, self.name, call.refusal)
        results = iter(call.op(*tensors))
        outputs = [next(results) if isinstance(o, TensorLayout)
                   else o.of(args) if isinstance(o, InputView) else o for o in call.outputs]
        outputs = [o.of(outputs) if isinstance(o, OutputView) else o for o in outputs]
        return outputs[0] if call.sequence is None else call.sequence(outputs)

    def _define(self, state, args) -> GraphCall:
        mutated, outputs, sequence, refusal = _analyse(self.graph_module, args)
        tensor_positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        name = f"{self.name}_{len(self.calls)}"
        params = ", ".join(f"Tensor(a{n}!) t{n}" if i in mutated else f"Tensor t{n}"
                           for n, i in enumerate(tensor_positions))
        lib = _library()
        lib.define(f"{name}({params}) -> Tensor[]")
        # the graph's non-tensor arguments: the op keeps this for the process (torch.library), so
        # it must hold no tensor (the first call's inputs would never be freed)
        template = [None if isinstance(a, torch.Tensor) else a for a in args]
        compiled = self.compiled
        fresh = [o for o in outputs if isinstance(o, TensorLayout)]
        # on the emulated device the graph's code runs on the cpu tensors the device's are, its
        # random ops drawing from the device's generators; in the graph sanitizer the tensors
        # are the GPU's and the code runs as it is
        draws = self.draws and state.kind == "cpu"
        if state.kind == "cpu":
            device_only = self._placement(args, _key(args)).host is None
            on_device = lambda: _on_device(state, device_only)  # noqa: E731
        else:
            on_device = contextlib.nullcontext

        def run(*tensors):
            call_args = list(template)
            for i, t in zip(tensor_positions, tensors):
                call_args[i] = t
            with on_device(), _device_draws(state, draws):
                out = compiled(*call_args)
            if not isinstance(out, (tuple, list)):
                out = (out,)
            return [t for t, o in zip(out, outputs) if isinstance(o, TensorLayout)]

        def fake(*tensors):
            device = tensors[0].device if tensors else torch.device("meta")
            return [torch.empty_strided(o.size, o.stride, dtype=o.dtype, device=device)
                    for o in fresh]

        lib.impl(name, run, "CPU" if state.kind == "cpu" else "CUDA")
        lib.impl(name, fake, "Meta")
        try:
            torch.library.register_fake(f"{_LIBRARY_NAME}::{name}", fake, lib=lib)
        except RuntimeError as error:
            # torch 2.11 refuses a fake kernel beside a Meta one; there the Meta kernel serves
            # fake tensors alike.
            if "already has an DispatchKey::Meta" not in str(error):
                raise
        op = getattr(getattr(torch.ops, _LIBRARY_NAME), name).default
        return GraphCall(op, outputs, None if self.bare_output else sequence, refusal)


def _graph_constants(graph_module) -> tuple:
    """The tensors the graph reads as attributes (inductor's constants, under freezing): memory of
    the module, not of the trees' pool, which an output may be or alias."""
    out = []
    for node in graph_module.graph.nodes:
        if node.op == "get_attr":
            value = graph_module
            for part in node.target.split("."):
                value = getattr(value, part, None)
            if isinstance(value, torch.Tensor):
                out.append(value)
    return tuple(out)


def _log_skip(message: str) -> None:
    """Inductor's `log_cudagraph_skip_and_bump_counter`: its log line, its count of skipped
    graphs, and its RuntimeError under `triton.cudagraph_or_error`."""
    utils = torch_internals.lazy_module("inductor_cudagraph_utils")
    log = getattr(utils, "log_cudagraph_skip_and_bump_counter", None)
    if log is not None:
        log(message)
        return
    counters = torch_internals.lazy_module("dynamo_utils").counters
    counters["inductor"]["cudagraph_skips"] += 1
    if getattr(torch_internals.lazy_module("inductor_config").triton, "cudagraph_or_error", False):
        raise RuntimeError(message)


def _device_sees_calls() -> bool:
    """Whether a torch call made here reaches the device's dispatch modes (a capture's recorder,
    the stream tracking). Inside the kernel of an op they dispatched (a runtime's custom op, the
    harness's compiled piece, whose kernel calls compiled code) they are off: that op is the one
    the device tracks or records, and the compiled code inside runs as it is."""
    from harness.emulation.tracking.mode import StreamWork
    from harness.graphs.emulator.recorder import Recorder

    if torch_internals.dispatch_tls_is_dispatch_key_excluded(torch_internals.DISPATCH_KEY_PYTHON):
        return False
    return any(isinstance(mode, (Recorder, StreamWork))
               for mode in torch_internals.get_current_dispatch_mode_stack())


@contextlib.contextmanager
def _cublas_cleared(state):
    """cudagraph trees clear cuBLAS's workspaces before and after a warm-up or a recording: a
    workspace allocated then lives in the graph's pool for as long as the graph, not in the
    handle's cache (where the next generation would reuse memory the pool hands out again)."""
    state.blas_workspaces.clear()
    try:
        yield
    finally:
        state.blas_workspaces.clear()


def _pool_alias(state, t: torch.Tensor, aliases: dict, of=None) -> torch.Tensor:
    """A tensor over `t`'s memory with a storage of its own (cudagraph trees build their outputs
    so from the pool's pointers): an error set on one storage leaves the other readable.
    `aliases` maps a storage already aliased in this result to its alias; `of`, the storage the
    alias keeps alive (`t`'s own by default)."""
    storage = t.untyped_storage()
    alias = aliases.get(storage.data_ptr())
    if alias is None:
        alias = aliases[storage.data_ptr()] = torch_internals.construct_storage_from_data_pointer(
            storage.data_ptr(), state.storage_device, storage.nbytes())
        state.memory.mark_alias(alias, storage if of is None else of)
    with torch_internals.disable_current_modes(), torch.no_grad():
        out = torch.empty(0, dtype=t.dtype, device=state.storage_device)
        out.set_(alias, t.storage_offset(), t.size(), t.stride())
    return out


def _held_alias(state, t: torch.Tensor) -> torch.Tensor:
    """`t`, or where `t` is a tensor the trees handed out over their pool (an output of another
    recording, a saved activation a backward graph reads), a tensor of the recording's own over
    that memory: the next generation makes the handed tensor raise, and the recording reads the
    memory, not that tensor, at its replays."""
    pooled = t.untyped_storage().__dict__.get("_harness_alias_of")
    if pooled is None:
        return t
    return _pool_alias(state, t, {}, of=pooled)


def _output_traces(graph_module) -> list:
    """Per output of the graph, the user's line that made it (dynamo's stack trace)."""
    output = next((n for n in graph_module.graph.nodes if n.op == "output"), None)
    if output is None:
        return []
    values = output.args[0] if isinstance(output.args[0], (tuple, list)) else [output.args[0]]
    return [_users_frames(v.meta.get("stack_trace")) if isinstance(v, torch.fx.Node) else None
            for v in values]


def _symbolic_shapes_skip(graph_module) -> str | None:
    """Inductor's reason to run a graph with symbolic shapes without CUDA graphs under
    `triton.cudagraph_skip_dynamic_graphs` (compile_fx, with the first node of a symbolic value
    that has a stack trace), or None. With graph partition on inductor instead leaves every
    node using a symbol out of its graph partitions, counting no skip."""
    inductor_utils = torch_internals.lazy_module("inductor_utils")
    if not torch_internals.lazy_module("inductor_config").triton.cudagraph_skip_dynamic_graphs:
        return None
    nodes = graph_module.graph.nodes
    if not any(inductor_utils.any_is_symbolic(_traced_value(n)) for n in nodes
               if n.op == "placeholder"):
        return None
    trace = next((n.meta["stack_trace"] for n in nodes
                  if n.op != "placeholder" and n.meta.get("stack_trace")
                  and isinstance(_traced_value(n), torch.Tensor)
                  and inductor_utils.any_is_symbolic(_traced_value(n))), None)
    reason = "graph with symbolic shapes inputs and config.triton.cudagraph_skip_dynamic_graphs=True."
    return f"{reason} Found from {trace}\n" if trace else f"{reason}\n"


def _traced_value(node: torch.fx.Node) -> Any:
    """A node's fake value: dynamo's graphs keep it as `example_value`, AOTAutograd's as `val`."""
    return node.meta.get("val", node.meta.get("example_value"))


def _cudagraph_unsafe_op(graph_module) -> Any:
    """The first op of the graph tagged `torch.Tag.cudagraph_unsafe` (a user's op that syncs with
    the host, say), or None."""
    tag = getattr(torch.Tag, "cudagraph_unsafe", None)
    for node in graph_module.graph.nodes:
        if (tag is not None and node.op == "call_function"
                and isinstance(node.target, torch_internals.OpOverload)
                and tag in node.target.tags):
            return node.target
    return None


def _mutating_use_trace(graph_module, indices: list) -> str | None:
    """The user's line that writes the first of these inputs (inductor's "Found from"): the
    placeholder's one use, or its use by an in-place call."""
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    for i in indices:
        if i >= len(placeholders):
            continue
        users = list(placeholders[i].users)
        in_place = [u for u in users if _writes_first_argument(u)] if len(users) > 1 else users
        for use in in_place:
            trace = _users_frames(use.meta.get("stack_trace"))
            if trace:
                return trace
    return None


def _writes_first_argument(node) -> bool:
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    return isinstance(name, str) and name.endswith("_") and not name.endswith("__")


def _users_frames(trace: str | None) -> str | None:
    """Dynamo's stack trace less the device's own frames (the placement mode's __torch_function__
    stands in every traced call): CUDA's trace ends at the user's line."""
    if not trace:
        return trace
    import os
    import re

    own = '  File "' + os.path.dirname(os.path.abspath(__file__))
    return "".join(f for f in re.split(r'(?m)^(?=  File ")', trace) if not f.startswith(own))


class _ValueDependentLayout(RuntimeError):
    """An output whose size the fake-tensor run left as a symbol of tensor values (`nonzero()`)."""


def _data_dependent_errors() -> tuple:
    """What a fake-tensor run raises at an op whose result depends on tensor values: without a
    shape environment, or with one (`_analyse` has one) where a guard needs the value."""
    fake = torch_internals.lazy_module("fake_tensor")
    shapes = importlib.import_module("torch.fx.experimental.symbolic_shapes")
    return (_ValueDependentLayout, *(getattr(module, name) for module, name in (
        (fake, "DataDependentOutputException"), (fake, "DynamicOutputShapeException"),
        (shapes, "GuardOnDataDependentSymNode")) if hasattr(module, name)))


def _outputs_of(out) -> list:
    """A graph's result as a list of its outputs (one value returned bare is a list of one)."""
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _as_returned(outs: list, out):
    """`outs` in the shape `out` was returned in: bare, a list or a tuple."""
    if not isinstance(out, (tuple, list)):
        return outs[0]
    return type(out)(outs) if isinstance(out, list) else tuple(outs)


def _shares_memory(t: torch.Tensor, inputs: list) -> bool:
    storage = t.untyped_storage().data_ptr()
    return any(a.untyped_storage().data_ptr() == storage for a in inputs)


def _key(args) -> tuple:
    return tuple(TensorLayout.of(a) if isinstance(a, torch.Tensor) else (type(a), a) for a in args)


def _addresses(args, indices) -> tuple:
    return tuple(args[i].data_ptr() for i in indices)


def _static_addresses(args, static: frozenset) -> tuple:
    """Where the static inputs live: a recording replays against these addresses only."""
    return tuple(args[i].data_ptr() for i in sorted(static)
                 if i < len(args) and isinstance(args[i], torch.Tensor))


class _Replay:
    """One captured input layout of a reduce-overhead graph, for one set of static addresses."""

    def __init__(self, graph, inputs: list, outputs, copied: list[int],
                 static_addresses: tuple, position: int, managed: tuple = (),
                 args: tuple = (), node: int | None = None) -> None:
        self.graph, self.inputs, self.outputs, self.copied = graph, inputs, outputs, copied
        self.static_addresses = static_addresses
        self.position = position  # its run's place among this layout's runs in a generation
        self.handed = None  # what the replays return: aliases of `outputs`, made at the first
        # inputs that were outputs of a recording ("cudagraph managed"): where they were
        self.managed = managed
        self.managed_addresses = _addresses(args, managed)
        self.node = node  # the trees' id of this recording
        self.written: tuple[int, ...] = ()  # copied inputs the graph writes (set by `capture`)
        self.static_indices: tuple[int, ...] = ()  # the static inputs (set by `capture`)

    @staticmethod
    def capture(device_graph: DeviceGraph, state, args, position: int) -> "_Replay":
        managed = tuple(i for i, a in enumerate(args)
                        if isinstance(a, torch.Tensor) and i not in device_graph.static
                        and state.trees.is_managed(a))
        # The trees read a managed input where it is, baked into the graph; the device copies it
        # as any other input (the same values: its memory is another recording's, which the
        # generations release), and keeps only the trees' rule that it may not move.
        copied = [i for i, a in enumerate(args)
                  if isinstance(a, torch.Tensor) and i not in device_graph.static]
        inputs = list(args)
        for i in copied:
            inputs[i] = args[i].clone()
        for i in device_graph.static:
            if i < len(args) and isinstance(args[i], torch.Tensor):
                inputs[i] = _held_alias(state, args[i])
        device_graph.pool_handle()
        graph = torch.cuda.CUDAGraph()
        stream = state.trees.capture_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with _cublas_cleared(state), torch.cuda.graph(graph, pool=device_graph.pool, stream=stream):
            outputs = device_graph(*inputs)
        torch.cuda.current_stream().wait_stream(stream)
        # The outputs' blocks are the tensors' the program is handed (`_aliased`), not the
        # recording's: on CUDA they go back to the pool when the program drops the outputs.
        for t in device_graph._pool_outputs(args, outputs)[0]:
            state.memory.release_storage(t.untyped_storage())
        recorded = _Replay(graph, inputs, outputs, copied,
                           _static_addresses(args, device_graph.static), position, managed,
                           args, state.trees.new_node())
        # the trees count each recording's inputs that are neither static nor managed (the
        # ones a replay copies in; ints among them), in inductor's counters
        torch_internals.lazy_module("dynamo_utils").counters["inductor"][
            "cudagraph_recorded_non_static_inputs"] += sum(
                1 for i in range(len(args)) if i not in device_graph.static and i not in managed)
        mutated = device_graph.mutated_inputs.get(_key(args), frozenset())
        recorded.written = tuple(i for i in copied if i in mutated)
        recorded.static_indices = tuple(sorted(device_graph.static))
        return recorded

    def replay(self, args, trees):
        for i in self.copied:
            if args[i] is not self.inputs[i]:
                self.inputs[i].copy_(args[i])
        recording = self.graph.recording
        if recording is not None:
            # The trees replay a recording whose static inputs are at the addresses it captured
            # (checked by the caller), not necessarily the same buffers: a parameter reassigned
            # with `.data = ...` whose new memory landed where the old one was freed is read there.
            recording.adopt_reallocated(lambda: [
                args[i].untyped_storage() for i in self.static_indices
                if i < len(args) and isinstance(args[i], torch.Tensor)])
        self.graph.replay()
        # The trees write a managed input where it is; the device wrote its copy, so the
        # caller's tensor gets the values the graph wrote (an output aliasing it is rebuilt
        # from the caller's tensor, as AOTAutograd rebuilds it).
        for i in self.written:
            if args[i] is not self.inputs[i]:
                args[i].copy_(self.inputs[i])
        trees.node = self.node  # the trees' path is at this node now
        return self.outputs


def _analyse(graph_module, args) -> tuple[frozenset, tuple, type | None, Refusal | None]:
    """Run the graph on fake tensors: which inputs it writes, what it returns, and its first op
    that CUDA refuses in a capture."""
    from torch.multiprocessing.reductions import StorageWeakRef

    with torch_internals.disable_current_modes(), torch_internals.DisableTorchFunction():
        # A ShapeEnv lets the graph read a scalar input's value (`item()`): a float that
        # `dynamic=True` passes as a 0-dim tensor becomes a symbol instead of an error.
        mode = torch_internals.fake_tensor_mode(allow_non_fake_inputs=True,
                                                shape_env=torch_internals.shape_env())
        with mode:
            # on each input's own device (the graph sanitizer's are the GPU's, as its parameters)
            fakes = [torch.empty_strided(a.size(), a.stride(), dtype=a.dtype, device=a.device)
                     .as_strided(a.size(), a.stride(), a.storage_offset())
                     if isinstance(a, torch.Tensor) else a for a in args]
        versions = [f._version if isinstance(f, torch.Tensor) else None for f in fakes]
        refusals = FirstRefusal()
        with mode, refusals, torch_internals.DisableTorchFunction():
            out = graph_module(*fakes)
    sequence = list if isinstance(out, list) else tuple if isinstance(out, tuple) else None
    out = out if isinstance(out, (tuple, list)) else (out,)
    inputs = {StorageWeakRef(f.untyped_storage()): i for i, f in enumerate(fakes)
              if isinstance(f, torch.Tensor)}
    outputs = []
    for o in out:
        if isinstance(o, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise _ValueDependentLayout(f"output {o} (a value read from a tensor)")
        if not isinstance(o, torch.Tensor):
            outputs.append(o)
            continue
        aliased = inputs.get(StorageWeakRef(o.untyped_storage()))
        if aliased is not None:
            outputs.append(InputView(aliased, tuple(o.size()), tuple(o.stride()),
                                     o.storage_offset()))
            continue
        if not all(isinstance(n, int) for n in (*o.size(), *o.stride(), o.storage_offset())):
            raise _ValueDependentLayout(f"output of shape {tuple(o.size())}")
        outputs.append(TensorLayout.of(o))
    mutated = frozenset(i for i, (f, v) in enumerate(zip(fakes, versions))
                        if isinstance(f, torch.Tensor) and f._version != v)
    return mutated, _views_of_outputs(outputs, out), sequence, refusals.refusal


def _views_of_outputs(outputs: list, out) -> tuple:
    """`outputs` with each fresh output that shares its memory with another one made an
    OutputView of the one among them whose extent holds the others' (the op returns that one
    alone). A group without such an output stays as separate outputs."""
    from torch.multiprocessing.reductions import StorageWeakRef

    groups: dict = {}
    for i, (layout, o) in enumerate(zip(outputs, out)):
        if isinstance(layout, TensorLayout) and o.numel():
            groups.setdefault(StorageWeakRef(o.untyped_storage()), []).append(i)
    outputs = list(outputs)
    for members in groups.values():
        spans = {i: _span(outputs[i]) for i in members}
        base = next((b for b in members if all(
            spans[b][0] <= spans[i][0] and spans[i][1] <= spans[b][1] for i in members)), None)
        if len(members) < 2 or base is None:
            continue
        for i in members:
            if i != base:
                layout = outputs[i]
                outputs[i] = OutputView(base, layout.size, layout.stride,
                                        layout.storage_offset - outputs[base].storage_offset)
    return tuple(outputs)


def _span(layout: TensorLayout) -> tuple[int, int]:
    """The elements of its storage a layout reaches: [first, last + 1)."""
    last = layout.storage_offset + sum((n - 1) * s for n, s in zip(layout.size, layout.stride))
    return layout.storage_offset, last + 1


def _draws(graph_module) -> bool:
    """Whether the graph calls a random torch function (a random aten op of inductor's code or
    a fallback to one follows from it)."""
    from harness.emulation.device_draws import may_draw

    for node in graph_module.graph.nodes:
        target = (getattr(torch.Tensor, node.target, None) if node.op == "call_method"
                  else node.target if node.op == "call_function" else None)
        if target is not None and may_draw(target, dict(node.kwargs)):
            return True
        if node.op == "call_function" and any(  # a higher-order operator's op (compiled_rng.py)
                isinstance(a, torch_internals.OpOverload) and may_draw(a, {}) for a in node.args):
            return True
    return False


def _device_draws(state, draws: bool):
    """The graph's random aten ops (inductor's seeds, its fallbacks to aten's random kernels)
    draw from the device's generator, as CUDA's do, where they drew from the cpu's: a compiled
    `torch.multinomial` then draws what the eager one does. Inside a capture the recorder meets
    them (a replay draws afresh)."""
    from harness.emulation.device_draws import EagerDraws, recorded

    if not draws or state.capturing() or recorded():
        return contextlib.nullcontext()
    return EagerDraws(state.draws, state.current_index)


def _device_kernels(differ: bool):
    """The graph's aten ops meet CUDA's kernels where the CPU's differ (compiled_kernels.py)."""
    return compiled_kernels.DeviceKernels() if differ else contextlib.nullcontext()


@contextlib.contextmanager
def _on_device(state, device_only: bool = False):
    """The graph's own code runs with the placement mode off the stack, its factories counted as
    device memory (a capture's recorder asks that). `device_only`: the graph works on device
    memory only, so the buffers it hands a user's op body are device memory (op_bodies.py)."""
    memory = state.memory
    previous = memory.call_on_device, memory.compiled_on_device
    memory.call_on_device, memory.compiled_on_device = True, device_only
    try:
        with _without_placement(state):
            yield
    finally:
        memory.call_on_device, memory.compiled_on_device = previous


@contextlib.contextmanager
def _without_placement(state):
    """The placement mode off the stack: device tensors are the cpu tensors they are."""
    from harness.emulation.backward import put_back_function_mode, remove_function_mode

    placement = state.placement
    stack = _get_current_function_mode_stack()
    index = next((i for i, m in enumerate(stack) if m is placement), None)
    if index is not None:
        remove_function_mode(placement)
    try:
        yield
    finally:
        if index is not None:
            put_back_function_mode(placement, index)


def _refuse_cuda_autocast(gm) -> None:
    """The device's autocast casts at each torch call (autocast.py); inside a compiled graph the
    ops are aten ops on cpu tensors, which CUDA's autocast lists would not reach, so the graph
    would run in float32 where CUDA runs float16. Refused rather than computed differently."""
    inside = any(node.op == "call_function" and getattr(node.target, "__name__", "") ==
                 "_enter_autocast" and node.args and node.args[0] == "cuda"
                 for node in gm.graph.nodes)
    if inside or torch.is_autocast_enabled("cuda"):
        raise CompiledGraphError(
            "torch.autocast('cuda') " + ("inside" if inside else "around") + " a torch.compile'd "
            "function on the emulated CUDA device: the device casts at each eager torch call, and "
            "a compiled graph's ops are not cast, so it would compute in float32 where CUDA casts "
            "to the autocast dtype; cast explicitly (.half(), .to(dtype)) inside the compiled code, "
            "or run that part eagerly")


def _backend_name(compiler_fn) -> str:
    fn = getattr(compiler_fn, "compiler_fn", compiler_fn)  # dynamo's WrapBackendDebug
    fn = getattr(fn, "_torchdynamo_orig_backend", fn)
    name = getattr(fn, "compiler_name", None) or getattr(fn, "__name__", None)
    if name is None:  # aot_autograd(...) backends: an object holding its forward compiler
        inner = getattr(fn, "kwargs", {}).get("fw_compiler")
        name = "aot_" + getattr(inner, "__name__", type(fn).__name__)
        if name == "aot_nop" or name == "aot_boxed_nop":
            name = "aot_eager"
    return str(name)


def user_compiler_on_device(original):
    """A replacement for dynamo's `OutputGraph.call_user_compiler` (what hands each graph to the
    backend): the backend compiles with torch's own CUDA answers, and the graph it returns runs
    as a `DeviceGraph`."""
    from harness.emulation.active import emulation_active

    real_is_available = torch.cuda.is_available

    def call_user_compiler(self, gm, example_inputs):
        if emulation_active() != "cpu":
            return original(self, gm, example_inputs)
        from harness.emulation.compiled_training import (autograd_cache_off, training_compiles,
                                                         wrapper_inputs)

        _refuse_cuda_autocast(gm)
        _user_triton_kernels_as_device_ops(gm)
        backend = _backend_name(self.compiler_fn)
        # inductor's code for a cpu graph cannot hold stream blocks: the stream calls run around
        # the graph's one op instead (compiled_stream_nodes.py)
        plan = plan_of(gm) if backend in _OPAQUE_BACKENDS else None
        stream_calls = taken_out(gm) if backend in _OPAQUE_BACKENDS else None
        # a backend of eager ops: AOTAutograd's training graphs hold the transfers themselves
        on_device = any(isinstance(a, torch.Tensor) and is_device_memory(a) for a in example_inputs)
        with _torchs_own_cuda(real_is_available), _triton_ops_kept_whole(), \
                autograd_cache_off(), inputs_of(example_inputs), wrapper_inputs(example_inputs), \
                training_compiles() as training, transfers_in_aot_graphs(
                    on_device if backend not in _DEVICE_GRAPH_BACKENDS and has_transfers(gm)
                    else None) as rewritten, compiled_afresh(stream_calls):
            try:
                compiled = original(self, gm, example_inputs)
            except Exception as error:
                if _compiles_a_user_triton_kernel(error):
                    raise _user_triton_kernel_refused(error) from error
                raise
        pieces = None if plan is None else StreamPieces(plan)
        if isinstance(compiled, StreamOrderedGraph):  # compile_fx took the graph's stream calls
            stream_calls, pieces, compiled = compiled.calls, compiled.pieces, compiled.graph
        if isinstance(compiled, DeviceGraph):  # inductor's compile_fx, called by the backend
            compiled = compiled.compiled
        split = bool(training)
        graph = DeviceGraph(compiled, gm, backend, autograd_split=split,
                            cudagraphs=not split and wants_cudagraphs(self.compiler_fn, backend))
        graph.aot_transfers = bool(rewritten)
        return graph if stream_calls is None else StreamOrderedGraph(graph, stream_calls, pieces)

    return call_user_compiler


def _user_triton_kernels_as_device_ops(gm) -> None:
    """Each user Triton kernel dynamo traced into `gm` (`kernel[grid](...)` in the compiled
    function) becomes a call of the device's op for that kernel (triton_launches.py), which runs it
    through Triton's interpreter when the graph runs: inductor, compiling for the cpu, would try to
    compile the kernel for a cpu backend triton does not have. A launch with a grid computed in
    the graph, or with TMA descriptors, is left to inductor (and refused by name there)."""
    hop = getattr(torch.ops.higher_order, "triton_kernel_wrapper_mutation", None)
    nodes = [node for node in gm.graph.nodes
             if node.op == "call_function" and hop is not None and node.target is hop]
    if not nodes or not triton_internals.installed() or triton_internals.problems():
        return
    from harness.emulation.active import active_state
    from harness.emulation.triton_launches import graph_launch

    table = torch_internals.lazy_module("triton_kernel_wrap").kernel_side_table
    state = active_state()
    for node in nodes:
        grid = tuple(node.kwargs["grid"][0])
        if node.kwargs.get("tma_descriptor_metadata") or not all(isinstance(g, int) for g in grid):
            continue
        arguments = {**node.kwargs["kwargs"],
                     **table.get_constant_args(node.kwargs["constant_args_idx"])}
        op, written, read, number = graph_launch(
            state, table.get_kernel(node.kwargs["kernel_idx"]), arguments, grid,
            lambda value: isinstance(value, torch.fx.Node))
        with gm.graph.inserting_before(node):
            gm.graph.call_function(op, (written, read, number))
        gm.graph.erase_node(node)
    gm.recompile()


def _triton_ops_kept_whole():
    """AOTAutograd with `torch.library.triton_op`s kept whole, as torch.export keeps them
    (`decompose_custom_triton_ops` off). AOTAutograd otherwise traces a triton_op into its body,
    whose kernels reach inductor as `triton_kernel_wrapper_*` nodes, and inductor, compiling the
    device's graph for the cpu, has no triton backend for them. Kept whole, the op is a call in the
    compiled graph: its body runs when the graph runs, its kernels launched as the device launches
    any (through Triton's interpreter, as one device op; a capture of the compiled function records
    the graph, whose replays run it again). The flag is AOTAutograd's config, so it is part of
    its cache key: a graph compiled so is never served to a compile that decomposes."""
    config = torch_internals.lazy_module("functorch_config")
    if not hasattr(config, "decompose_custom_triton_ops"):  # a torch before triton_op
        return contextlib.nullcontext()
    return config.patch(decompose_custom_triton_ops=False)


def _compiles_a_user_triton_kernel(error: BaseException) -> bool:
    """Whether inductor failed on a user's Triton kernel in the graph (a `kernel[grid](...)` left
    to it: a grid the graph computes, TMA descriptors): it compiles the device's graph for the
    cpu, and triton has no cpu backend to compile the kernel for."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        # triton 3.6 (torch 2.11's) finds no driver first: "0 active drivers ([]). There
        # should only be one."
        if type(error).__name__ == "TritonUnavailableError" or any(
                text in str(error) for text in ("triton not built with the 'cpu' backend",
                                                "0 active drivers")):
            return True
        error = error.__cause__ or error.__context__
    return False


def _user_triton_kernel_refused(error: BaseException) -> "UnsupportedOnEmulatedDevice":
    from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice

    return UnsupportedOnEmulatedDevice(
        "a user's Triton kernel inside a torch.compile'd function on the emulated CUDA device: "
        "inductor compiles the device's graphs for the cpu its tensors live on, and triton has no "
        "cpu backend to compile the kernel for (inductor: " + (str(error).strip().splitlines()
                                                               or [""])[-1][:200] + "). The "
        "emulated device runs Triton kernels launched eagerly (through Triton's interpreter); "
        "keep the launch out of the compiled region (torch.compiler.disable on the function that "
        "launches it) or run that function uncompiled under the emulation")


@contextlib.contextmanager
def _torchs_own_cuda(real_is_available):
    """Compiling for the host the device's tensors are: with torch's own CUDA answers, and with
    inductor's count of skipped CUDA graphs as it was. inductor compiles a reduce-overhead graph
    of the device for the cpu, finds cpu nodes and counts a skip (also on a cache hit, from the
    counts it cached), where CUDA counts none; DeviceGraph counts the skips CUDA makes."""
    emulated = torch.cuda.is_available
    torch.cuda.is_available = real_is_available
    counters = torch_internals.lazy_module("dynamo_utils").counters
    skips = counters["inductor"]["cudagraph_skips"]
    try:
        yield
    finally:
        torch.cuda.is_available = emulated
        # read again: compiling may replace the "inductor" counter object (a cache hit adds the
        # counts it cached to a copy); no count is no entry, as on CUDA
        if skips:
            counters["inductor"]["cudagraph_skips"] = skips
        else:
            counters["inductor"].pop("cudagraph_skips", None)


def inductor_on_host(original, inner_default):
    """A replacement for inductor's `compile_fx`, which a runtime's own backend calls on each piece
    of a split graph, outside dynamo and whenever it first meets a shape (vLLM's piecewise
    backend; harness.runtime.compiled): inductor compiles as dynamo's backends do here, with
    torch's own CUDA answers, and with the device's dispatch modes off the stack. Compiling is host
    work: its fake-tensor tracing is no device op for the stream tracking to order (it would meet
    ops such as `prim::device` that no kernel runs) nor for a capture to record. What it returns
    runs as a `DeviceGraph`: inductor's C++ kernels are no torch calls, so a runtime capturing the
    compiled piece in `torch.cuda.graph` would record only the calls between them (vLLM's
    default: pieces compiled per size, each captured)."""
    from harness.emulation.active import emulation_active

    real_is_available = torch.cuda.is_available

    def compile_fx(*args, **kwargs):
        if emulation_active() != "cpu":
            return original(*args, **kwargs)
        graph_module = args[0] if args else kwargs.get("model_")
        bare = isinstance(graph_module, torch.fx.GraphModule) and _returns_one_value(graph_module)
        # Without the placement mode the example inputs are the cpu tensors inductor writes code
        # for (it would build its pattern tables on the "cuda" they report).
        from harness.emulation.active import active_state
        from harness.emulation.compiled_training import (autograd_cache_off,
                                                         device_inner_compile, training_compiles)

        # AOTAutograd's graphs for training run as DeviceGraphs of their own: compile_fx hands
        # them to `inner_compile`, also a backward compiled lazily after compile_fx returned
        args, kwargs = list(args), dict(kwargs)
        inner = args.pop(2) if len(args) > 2 else kwargs.pop("inner_compile", inner_default)
        kwargs["inner_compile"] = device_inner_compile(inner, compiling, _aot_graph)
        # a graph with stream nodes from a backend of one's own (dynamo's inductor backend hands
        # this a graph already without them: user_compiler_on_device)
        plan = plan_of(graph_module) if isinstance(graph_module, torch.fx.GraphModule) else None
        stream_calls = (taken_out(graph_module) if isinstance(graph_module, torch.fx.GraphModule)
                        else None)
        with compiling(), _triton_ops_kept_whole(), autograd_cache_off(), \
                training_compiles() as training, transfers_in_aot_graphs(None), \
                compiled_afresh(stream_calls):
            compiled = original(*args, **kwargs)
        if not isinstance(graph_module, torch.fx.GraphModule) or isinstance(
                compiled, (DeviceGraph, StreamOrderedGraph)):
            graph = compiled  # compile_fx calls itself: the outer call wraps
        else:
            graph = DeviceGraph(compiled, graph_module, "inductor", bare_output=bare,
                                autograd_split=bool(training))
        return graph if stream_calls is None else StreamOrderedGraph(
            graph, stream_calls, None if plan is None else StreamPieces(plan))

    @contextlib.contextmanager
    def compiling():
        from harness.emulation.active import active_state

        with _torchs_own_cuda(real_is_available), torch_internals.disable_current_modes(), \
                _without_placement(active_state()), compiled_for_the_host():
            yield

    return compile_fx


def pieces_recorded_by_the_sanitizer(original):
    """A replacement for inductor's `compile_fx` under the graph sanitizer (emulate_cuda() on a
    GPU): the piece it returns runs as it is, except inside the sanitizer's capture, where it is
    recorded as one op that runs the compiled code again at each replay (`DeviceGraph`). The
    sanitizer's capture records the calls that reach the dispatcher, and a compiled piece's Triton
    kernels launch past it: a runtime capturing the piece (vLLM's default) recorded nothing and
    replayed nothing (seen on an H100, torch 2.11). Code compiled through dynamo is not affected:
    dynamo runs a compiled frame's original code while a dispatch mode such as the capture's
    recorder is active."""
    from harness.emulation.active import emulation_active

    def compile_fx(*args, **kwargs):
        graph_module = args[0] if args else kwargs.get("model_")
        # read before compiling: inductor rewrites a graph returning one value to return a list
        bare = isinstance(graph_module, torch.fx.GraphModule) and _returns_one_value(graph_module)
        compiled = original(*args, **kwargs)
        if emulation_active() != "cuda" or not isinstance(graph_module, torch.fx.GraphModule) \
                or isinstance(compiled, DeviceGraph):
            return compiled
        return DeviceGraph(compiled, graph_module, "inductor", bare_output=bare)

    return compile_fx


def sanitizer_compile_patches() -> list[tuple[Any, str, Any]]:
    """The (owner, name, replacement) entries the graph sanitizer adds for torch.compile."""
    inductor = torch_internals.lazy_module("inductor_compile_fx")
    return [(inductor, "compile_fx", pieces_recorded_by_the_sanitizer(inductor.compile_fx))]


def _aot_graph(compiled, graph_module, *, cudagraphs: bool, static, backward: bool = False,
               inference: bool = False, backend: str = "inductor") -> DeviceGraph:
    graph = DeviceGraph(compiled, graph_module, backend, cudagraphs=cudagraphs,
                        aot_static=static)
    graph.training = not inference
    graph.backward = backward
    return graph


def inductor_inner_on_host(original):
    """A replacement for inductor's `compile_fx_inner` where code calls it itself (PyTorch's tests
    do, on a `make_fx` graph and fake inputs): compiled as `compile_fx` is here (`inductor_on_host`),
    and what it returns, a boxed callable (one list of inputs, emptied), runs as a `DeviceGraph`,
    replayed through the device's graphs where `cudagraphs` (else inductor's config) asks for CUDA
    graphs, with `static_input_idxs` as its static inputs. Inductor's own calls of it inside a
    compile are left as they are (its `compile_fx` binds the original). It also replaces the
    module's `_compile_fx_inner`, which `compile_fx_inner` calls by name: code that bound
    `compile_fx_inner` before the emulation was entered reaches it there (the check of
    `torch.cuda.is_available` lets a call through this wrapper pass the second one)."""
    from harness.emulation.active import emulation_active

    real_is_available = torch.cuda.is_available

    def compile_fx_inner(*args, **kwargs):
        # inside a compile the emulation has given torch.cuda.is_available back to torch
        if emulation_active() != "cpu" or torch.cuda.is_available is real_is_available:
            return original(*args, **kwargs)
        graph_module = args[0] if args else kwargs.get("gm")
        from harness.emulation.active import active_state

        # stream marks and `torch.ops.streams` calls in the graph, as compile_fx takes them
        plan = plan_of(graph_module) if isinstance(graph_module, torch.fx.GraphModule) else None
        stream_calls = (taken_out(graph_module) if isinstance(graph_module, torch.fx.GraphModule)
                        else None)
        with _torchs_own_cuda(real_is_available), _triton_ops_kept_whole(), \
                torch_internals.disable_current_modes(), _without_placement(active_state()), \
                compiled_afresh(stream_calls):
            compiled = original(*args, **kwargs)
        if not isinstance(graph_module, torch.fx.GraphModule) or not callable(compiled):
            return compiled
        cudagraphs = kwargs.get("cudagraphs")
        cudagraphs = bool(torch_internals.lazy_module("inductor_config").triton.cudagraphs
                          if cudagraphs is None else getattr(cudagraphs, "value", cudagraphs))
        device_graph = DeviceGraph(lambda *inputs: compiled(list(inputs)), graph_module,
                                   "inductor", cudagraphs=cudagraphs,
                                   static=frozenset(kwargs.get("static_input_idxs") or ()))
        from harness.emulation.compiled_training import BoxedGraph

        if stream_calls is not None:
            return BoxedGraph(StreamOrderedGraph(device_graph, stream_calls,
                                                 None if plan is None else StreamPieces(plan)))
        return BoxedGraph(device_graph)

    return compile_fx_inner


def _returns_one_value(graph_module: torch.fx.GraphModule) -> bool:
    output = next(iter(graph_module.graph.find_nodes(op="output")), None)
    return output is not None and bool(output.args) and isinstance(output.args[0], torch.fx.Node)


def compile_patches(state) -> list[tuple[Any, str, Any]]:
    """The (owner, name, replacement) entries cuda_api.patches() adds for torch.compile."""
    OutputGraph = torch_internals.lazy_module("dynamo_output_graph").OutputGraph
    inductor = torch_internals.lazy_module("inductor_compile_fx")
    partitioners = torch_internals.lazy_module("functorch_partitioners")

    clear_triton_answer()
    register_markers()
    from harness.emulation.compiled_device_reads import patches as device_read_patches
    from harness.emulation.compiled_training import dynamo_cudagraphs_on_device

    cudagraphs_backend = torch_internals.lazy_module("dynamo_backends_cudagraphs")
    return [(OutputGraph, "call_user_compiler", user_compiler_on_device(
        OutputGraph.call_user_compiler)),
            (cudagraphs_backend, "cudagraphs", dynamo_cudagraphs_on_device(
                cudagraphs_backend.cudagraphs,
                functools.partial(_aot_graph, cudagraphs=True, backend="cudagraphs"))),
            (inductor, "compile_fx", inductor_on_host(inductor.compile_fx,
                                                      inductor.compile_fx_inner)),
            (inductor, "compile_fx_inner", inductor_inner_on_host(inductor.compile_fx_inner)),
            # compile_fx_inner bound before the emulation (`from torch._inductor.compile_fx import
            # compile_fx_inner` in a runtime's module) calls this by its module's name
            (inductor, "_compile_fx_inner", inductor_inner_on_host(inductor._compile_fx_inner)),
            (partitioners, "functionalize_rng_ops",
             rng_ops_on_device(partitioners.functionalize_rng_ops))] \
        + aot_transfers_patch() \
        + direct_trees_refused() \
        + trees_reset() \
        + factories_patch() \
        + device_read_patches(state)


def clear_triton_answer() -> None:
    """torch caches whether Triton can run; an answer given inside the emulation must not outlive
    it (nor one from before decide inside it)."""
    _triton = torch_internals.lazy_module("triton_utils")
    cache_clear = getattr(getattr(_triton, "has_triton", None), "cache_clear", None)
    if cache_clear is not None:
        cache_clear()



def keep_dynamo_out() -> None:
    """Dynamo's code for a compiled function runs inside its frame callback, which takes every
    Python frame called from there for user code to compile; its guards on the current stream call
    `torch.accelerator.current_stream`, which is the device's. The device's own code (every module
    of harness.emulation and harness.graphs.emulator) is the driver, not user code: its frames run
    as plain Python (compiled as frames of their own, their stream guards would call them again
    without end). Dynamo still inlines them where compiled code calls them."""
    import sys
    import types

    skip_code = getattr(torch_internals.lazy_module("dynamo_eval_frame"), "skip_code", None)
    if skip_code is None:
        return
    codes: list = []
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(("harness.emulation", "harness.graphs.emulator")):
            continue
        for value in vars(module).values():
            for fn in (vars(value).values() if isinstance(value, type) else (value,)):
                fn = getattr(fn, "__func__", fn)
                if isinstance(fn, types.FunctionType) and fn.__module__ == name:
                    codes.append(fn.__code__)
    while codes:
        code = codes.pop()
        skip_code(code)
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
