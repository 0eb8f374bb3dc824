"""Inductor's cudagraph trees as the emulated CUDA device stands in for them.

On a CUDA build of torch a reduce-overhead graph runs through torch's own trees over the
device's graph pools (compiled_graphs.py, pool_checkpoints.py). On a build that lacks what the
trees call (a CPU wheel), the device replays it through its own emulated graphs
(compiled_graphs.py, `DeviceGraph`), with this module's generations standing in for the trees'.
Two things decide, as on CUDA, whether a graph gets that treatment, and one thing is refused by
name:

- **Which graphs.** Inductor reads `triton.cudagraphs` from its config when it compiles a graph:
  `mode="reduce-overhead"` (or `options={"triton.cudagraphs": ...}`) sets it for that compile, and
  otherwise the process-wide `torch._inductor.config.triton.cudagraphs` holds (PyTorch's own
  cudagraph-trees tests set it and call plain `torch.compile(fn)`). `backend="cudagraphs"` is
  cudagraph trees over AOTAutograd's graphs: its ops run one by one, so the device's graphs
  capture them as they do an eager region. (Compiling for the cpu the device's tensors are, that
  backend and inductor skip CUDA graphs themselves, "cpu device"; the device counts no such skip.)
- **Trees driven directly.** `torch._inductor.cudagraph_trees.cudagraphify_impl` (what tests
  call) keeps its graphs' memory in CUDA's caching allocator: private pools, checkpoints of the
  allocator's state, storages rebuilt from raw pointers. The emulated device answers those calls
  over its graph pools (pool_checkpoints.py), so torch's own trees run on it. A build that lacks
  a piece the trees call and the device cannot stand in for (the CPU wheels: the storage
  access-error calls) is refused by name with `UnsupportedOnEmulatedDevice`.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, Iterator

import torch

from harness import torch_internals

# What torch's own trees need from torch as it is: absent from a build, they cannot run (the CPU
# wheels lack the two access-error calls, which need a CUDA build; torch 2.11 lacks the storage
# swap that moves an allocation into a graph pool, pool_checkpoints.py).
TREES_NEED_FROM_TORCH = ("set_storage_access_error_msg", "set_storage_data_ptr_access_error_msg",
                         "stash_obj_in_tls", "get_obj_in_tls", "is_key_in_tls",
                         "storage_swap_data_ptr")

DIRECT_TREES_REFUSED = (
    "inductor's cudagraph trees driven directly (torch._inductor.cudagraph_trees.{name}, which "
    "torch.compile(backend='cudagraphs') also calls) on the emulated CUDA device with torch "
    "{version}: this build lacks {missing}, which the trees (their outputs' access errors) or the "
    "device under them (an allocation moved into their pool) need, and the emulated device cannot "
    "stand in for (a CUDA build of torch 2.12 or later has them, with or without a GPU). "
    "torch.compile(mode='reduce-overhead') replays through the device's own graphs on any build; "
    "use that, or such a build of torch")


def wants_cudagraphs(compiler_fn, backend: str) -> bool:
    """Whether inductor would wrap the graph it compiles for `compiler_fn` in CUDA graphs: the
    compile's own options first (a mode's or `options=`), else inductor's config as it is now."""
    fn = getattr(compiler_fn, "compiler_fn", compiler_fn)
    fn = getattr(fn, "_torchdynamo_orig_backend", fn)
    config = getattr(fn, "config", None)
    if isinstance(config, dict) and "triton.cudagraphs" in config:
        return bool(config["triton.cudagraphs"])
    if backend == "cudagraphs":  # dynamo's backend: cudagraph trees over AOTAutograd's graphs
        return True
    if backend != "inductor":
        return False
    return bool(torch_internals.lazy_module("inductor_config").triton.cudagraphs)


def trees_missing_pieces() -> list[str]:
    """The torch names of TREES_NEED_FROM_TORCH this build lacks."""
    return [torch_internals.NAMES[name].path for name in TREES_NEED_FROM_TORCH
            if torch_internals.optional_name(name) is None]


def direct_trees_refused() -> list[tuple[Any, str, Any]]:
    """(owner, name, replacement) for cudagraph trees' entry points on the emulated device
    without a GPU: torch's own trees run over the device's graph pools (pool_checkpoints.py),
    refused by name on a build that lacks a piece they need (`trees_missing_pieces`); elsewhere
    (natively, the graph sanitizer's own refusal) torch's run."""
    from harness.emulation.active import emulation_active
    from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice

    trees = torch_internals.lazy_module("inductor_cudagraph_trees")
    missing = trees_missing_pieces()
    if not missing:
        return []
    out = []
    for name in ("cudagraphify_impl", "cudagraphify"):
        original = getattr(trees, name, None)
        if original is None:
            continue

        def refused(*args, _original=original, _name=name, **kwargs):
            if emulation_active() != "cpu":
                return _original(*args, **kwargs)
            raise UnsupportedOnEmulatedDevice(DIRECT_TREES_REFUSED.format(
                name=_name, version=torch.__version__, missing=", ".join(missing)))

        out.append((trees, name, refused))
    return out


class TreeGenerations:
    """Cudagraph trees' generations: what a reduce-overhead graph's warm-up and recording return is
    memory of the trees' pool, which the next generation reuses. A generation is one top-level
    call of a compiled function (dynamo counts them), or the step between two
    `torch.compiler.cudagraph_mark_step_begin()` calls; when a graph runs in a new one, the trees
    make every output of the previous generation's warm-ups and recordings still alive raise
    "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run" when its
    memory is read through any tensor over it (`torch._C._set_storage_data_ptr_access_error_msg`).
    A replay's outputs are the same tensors from replay to replay and are not made to raise. A
    generation whose last training forward has not had a backward run since is not ended (the
    trees wait for it: `running_forwards_with_pending_backwards`).
    Only a torch built with CUDA (a CUDA wheel, with or without a GPU) has the call that makes a
    storage raise; on a CPU wheel the outputs keep what the next run wrote, as before.
    """

    def __init__(self) -> None:
        self.current: int | None = None
        self._runs: dict[tuple, int] = {}  # (graph, layout) -> its runs in this generation
        # The trees' numbering: a function id per graph (in the order they first ran), a node id
        # per recording; the node the path of this generation is at (the last recording that
        # ran in it), under which a graph's next recording is a child.
        self._function_ids: Any = weakref.WeakKeyDictionary()
        self._nodes = 0
        self.node: int | None = None
        # Outputs of recordings handed to the program (storage key -> weakref to the storage):
        # "cudagraph managed" tensors, which a recording reading them bakes in by address.
        self._managed: dict[int, Any] = {}
        # (node, function id) -> re-recordings because a managed input moved; pairs past the limit
        self._rerecords: dict[tuple, int] = {}
        self.eager: set[tuple] = set()
        self._warned_mutation: set[int] = set()  # function ids whose input writes were logged
        # (weakref to the tensor, weakref to its storage, stack trace): the storage is what the
        # next generation overwrites, whatever tensor (a `.detach()`, a view) the program keeps
        self._pool_outputs: list[tuple[Any, Any, str | None]] = []
        self._graphs: Any = weakref.WeakSet()  # the DeviceGraphs that ran with CUDA graphs
        # a training forward ran and no backward since (the trees' flag, set after each run)
        self.pending_backward = False
        # per device: the one side stream the trees' manager records every graph on
        self._streams: dict[int, Any] = {}
        # per device: what the allocator's model keys the pool of the warm-ups by, and its id
        self._warm_pools: dict[int, tuple[WarmUpPool, tuple[int, int]]] = {}

    def reset(self) -> None:
        """`torch._dynamo.reset()`: cudagraph trees shut down, their graphs dropped even where
        compiled code that ran them is still referenced; the device's graphs let go of their
        recordings likewise. Outputs the program holds stay readable."""
        for graph in list(self._graphs):
            graph.release_recordings()
        # torch's shutdown of the trees sets no access error on outputs the program still holds
        # (none raised natively on an H100, torch 2.11, 2026-12-06): they stay readable.
        self._pool_outputs = []
        self._runs = {}
        self.current = None
        self.pending_backward = False
        self._function_ids = weakref.WeakKeyDictionary()
        self._nodes = 0
        self.node = None
        self._managed = {}
        self._rerecords = {}
        self.eager = set()
        self._warned_mutation = set()
        self._streams = {}
        self._warm_pools = {}

    def note_graph(self, graph) -> None:
        """`graph` (a DeviceGraph) holds recordings or a function of torch's trees, which
        `reset` releases."""
        self._graphs.add(graph)

    def capture_stream(self):
        """The stream recordings on the current device are captured on: one per device, as the
        trees' manager keeps one (its graph-pool segments then all belong to that stream)."""
        index = torch.cuda.current_device()
        stream = self._streams.get(index)
        if stream is None:
            stream = self._streams[index] = torch.cuda.Stream()
        return stream

    @contextlib.contextmanager
    def warming_up(self, memory) -> Iterator[None]:
        """A warm-up runs as the trees run it (`_use_cuda_memory_pool_manager`): on their side
        stream, after it waits for the current one, with the thread's device allocations routed
        to their graph pool (CUDA's beginAllocateCurrentThreadToPool, endAllocateToPool and
        releasePool); the current stream then waits for it. What is alive after it stays a
        block of that pool. The device keeps its warm-ups' pool apart from its recordings'."""
        index = torch.cuda.current_device()
        warm = self._warm_pools.get(index)
        if warm is None:
            # its own id, as graph_pool_handle() hands out (a snapshot's segment_pool_id)
            warm = self._warm_pools[index] = (WarmUpPool(), torch.cuda.graph_pool_handle())
        stream = self.capture_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), allocating_to_pool(memory, *warm):
            yield
        torch.cuda.current_stream().wait_stream(stream)

    def enter(self, graph, memory=None) -> Any:
        """`graph`, a reduce-overhead DeviceGraph, is about to run: end the previous generation if
        this is a new one, its outputs' blocks back in the pool (of `memory`, the device's
        DeviceMemory). Returns the generation it runs in."""
        self._graphs.add(graph)
        self.function_id(graph)  # the trees number functions as they first run
        trees = torch_internals.lazy_module("inductor_cudagraph_trees")
        generation = trees.CUDAGraphTreeManager.get_curr_generation()
        if generation == self.current:
            return self.current
        if self.pending_backward and not trees.MarkStepBox.mark_step_counter:
            return self.current  # a forward whose backward is pending: trees keep it going
        # A build without it (the CPU wheels: torch defines it with CUDA) cannot make a storage
        # raise on access; there the outputs keep what the next run wrote, silently.
        refuse_access = torch_internals.optional_name("set_storage_data_ptr_access_error_msg")
        # The trees free those blocks (`_free_And_Remove_DeleterFn`) whether or not a storage can
        # be made to raise; the next generation's allocations may take them.
        for _, ref, _ in self._pool_outputs if memory is not None else ():
            storage = ref()
            if storage is not None:
                memory.release_storage(storage)
        for _, ref, trace in self._pool_outputs if refuse_access is not None else ():
            storage = ref()
            if storage is not None:
                _refuse(storage, trees.CUDAGraphTreeManager.format_dealloc_msg(trace),
                        refuse_access)
        self._pool_outputs = []
        self._runs = {}
        self.current = generation
        self.node = None
        return generation

    def ran(self, graph) -> None:
        """`graph` ran (warmed up, recorded or replayed): after a training forward the trees wait
        for a backward before a new generation, after a backward no more. Until 2026-12-07 the
        device waited while any output of the generation required grad instead, so a training
        loop that kept the last step's loss (`loss = f(x).sum()`) never left its first
        generation: it warmed up at every step and never recorded."""
        if graph.training:
            self.pending_backward = not graph.backward

    def function_id(self, graph) -> int:
        """The trees' id of `graph`'s function: functions are numbered as they first run."""
        found = self._function_ids.get(graph)
        if found is None:
            found = self._function_ids[graph] = len(self._function_ids)
        return found

    def new_node(self) -> int:
        node, self._nodes = self._nodes, self._nodes + 1
        return node

    def note_managed(self, outputs) -> None:
        """`outputs` (a recording's, as handed to the program) live in the trees' pool."""
        for t in outputs if isinstance(outputs, (tuple, list)) else (outputs,):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                self._managed[torch_internals.storage_key(storage)] = weakref.ref(storage)

    def is_managed(self, t) -> bool:
        """Whether `t` is an output of a recording (the trees' `_is_cuda_graph_recorded_tensor`)."""
        try:
            storage = t.untyped_storage()
        except RuntimeError:  # overwritten: made to raise
            return False
        ref = self._managed.get(torch_internals.storage_key(storage))
        return ref is not None and ref() is storage

    def warn_mutation(self, graph) -> bool:
        """Whether `graph`'s skip for writing an input of its own is to be logged: once per
        function, as the trees warn."""
        function = self.function_id(graph)
        if function in self._warned_mutation:
            return False
        self._warned_mutation.add(function)
        return True

    def rerecord(self, graph) -> int:
        """A recording of `graph` under the current node is to be made again because a managed
        input moved: how many times that happened there (the trees count it per node and
        function against `triton.cudagraph_unexpected_rerecord_limit`)."""
        key = (self.node, self.function_id(graph))
        self._rerecords[key] = self._rerecords.get(key, 0) + 1
        return self._rerecords[key]

    def position(self, graph, layout) -> int:
        """How many times `graph` ran with `layout` before in this generation (0 the first)."""
        key = (id(graph), layout)
        count = self._runs.get(key, 0)
        self._runs[key] = count + 1
        return count

    def note_pool_outputs(self, outputs: list, traces: list) -> None:
        """Outputs of a warm-up or a recording that live in the trees' pool (not aliases of the
        graph's inputs)."""
        for t, trace in zip(outputs, traces):
            self._pool_outputs.append((weakref.ref(t), weakref.ref(t.untyped_storage()), trace))


class WarmUpPool:
    """What the allocator's model keys the pool of a device's warm-ups by (weakly)."""

    __slots__ = ("__weakref__",)


@contextlib.contextmanager
def allocating_to_pool(memory, handle, pool_id: tuple[int, int]) -> Iterator[None]:
    """The device allocations of this thread on the current device come from the graph pool of
    `handle` (CUDA's id `pool_id`) meanwhile, as cudagraph trees route a warm-up's
    (`_use_cuda_memory_pool_manager`: CUDA's beginAllocateCurrentThreadToPool, endAllocateToPool
    and releasePool): the pool is in use for the duration, and what is still alive after it
    stays a block of the pool."""
    index = torch.cuda.current_device()
    with memory.thread_allocating_to(index, memory.accounting(index).pool_of(handle, pool_id)):
        yield


def rerecord_limit_exceeded(count: int, static_input_moved: bool) -> bool:
    """Whether a function re-recorded `count` times under one node now runs without a graph there,
    as this torch's trees decide: their own `exceed_rerecord_limit` answers for the count (torch
    2.11's ignores the limit while dynamo inlines nn modules, its default; 2.13 on compare it with
    `triton.cudagraph_unexpected_rerecord_limit`), and a move of a static input (a parameter, a
    buffer marked static) is not counted at all where their `_run` leaves it out (2.13 on)."""
    manager = torch_internals.lazy_module("inductor_cudagraph_trees").CUDAGraphTreeManager
    if static_input_moved and not _static_moves_counted(manager):
        return False
    import types

    stand_in = types.SimpleNamespace(num_rerecord={None: {0: count}})
    return bool(manager.exceed_rerecord_limit(stand_in, None, 0))


def _static_moves_counted(manager) -> bool:
    import inspect

    try:
        source = inspect.getsource(manager._run)
    except (OSError, TypeError):  # no source shipped: the older trees, which counted them
        return True
    return "!= CheckInvariantStatus.StaticInputIdxMismatch" not in source


def _refuse(storage, message: str, refuse_access) -> None:
    """Release `storage`'s memory and make it raise `message` when read, through every tensor
    over it (a `.detach()` or a view the program made of the output too), as the trees free the
    outputs of the generation that ended. An alias over the pool (compiled_graphs.py) stops
    keeping the graph's own storage alive, and its own memory is the recording's, which it does
    not own: the memory goes back to the pool with the recording, as the trees free it."""
    storage.__dict__.pop("_harness_alias_of", None)
    refuse_access(torch_internals.storage_key(storage), message)


def trees_shut_down(every_threads: Callable[[], list[TreeGenerations]]) -> None:
    """Torch's cudagraph trees of the emulated device shut down (`reset_cudagraph_trees`), where
    the trees module was imported: their managers hold the device's graphs and pools; and the
    device's graphs let go of what they recorded (`every_threads`: the device's TreeGenerations,
    one per thread that ran a reduce-overhead graph)."""
    import sys

    trees = sys.modules.get(torch_internals.NAMES["inductor_cudagraph_trees"].module)
    if trees is not None:
        trees.reset_cudagraph_trees()
    for generations in every_threads():
        generations.reset()


def trees_reset() -> list[tuple[Any, str, Any]]:
    """`torch._dynamo.reset()` calls `reset_cudagraph_trees()` (imported at the call): on the
    emulated device it also releases the device's reduce-overhead recordings."""
    from harness.emulation.active import active_state, emulation_active

    trees = torch_internals.lazy_module("inductor_cudagraph_trees")
    original = getattr(trees, "reset_cudagraph_trees", None)
    if original is None:
        return []

    def reset_cudagraph_trees(*args, **kwargs):
        out = original(*args, **kwargs)
        if emulation_active() == "cpu":
            active_state().trees.reset()
        return out

    return [(trees, "reset_cudagraph_trees", reset_cudagraph_trees)]
