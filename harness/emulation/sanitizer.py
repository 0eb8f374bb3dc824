"""The graph sanitizer: emulate_cuda() on a machine with a GPU. Tensors, streams and kernels stay
real; only the graph API is replaced by the emulator (graphs.py), so unmodified code gets the
emulator's named errors (freed memory, rebound inputs, host syncs with their source line) where
CUDA would replay silently into stale memory."""

from __future__ import annotations

import contextlib
import gc
import warnings

import torch

from harness import torch_internals

from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice
from harness.emulation.compiled_graphs import sanitizer_compile_patches
from harness.emulation.graph_rng_holders import GraphRngHolders, HolderState
from harness.emulation.observers import Observed
from harness.emulation.pool_handles import PoolHandles
from harness.emulation.sanitizer_pools import AllocatorPool
from harness.emulation.tracking.capture_forks import CaptureForks
from harness.emulation.tracking.clocks import Clocks
from harness.emulation.tracking.real_streams import StreamIds, queue_key, tracking_in_force
from harness.graphs.emulator.watch_refs import install_swaps_past_watches
from harness.graphs.emulator.memory import ByDeviceType


class SanitizerHost(Observed):
    """What graphs.py's EmulatedCUDAGraph asks of its device, answered by the real GPU."""

    kind = "cuda"

    def __init__(self, real_graph_class: type, races: str = "strict") -> None:
        # torch's own CUDAGraph, taken before the emulation's replaces the public name: CUDA's
        # generator prologue and epilogue run only inside a real capture_begin/capture_end.
        self._real_graph_class = real_graph_class
        self._generators_left_capturing = False
        self._refused: list = []
        self.storage_device = torch.device("cuda", torch.cuda.current_device())
        self.kernel_device = self.storage_device
        self.memory = ByDeviceType(self.storage_device)
        # Real pools of CUDA's allocator (sanitizer_pools.py), their ids from torch's own counter
        # so that a torch.cuda.MemPool made beside them never gets the same id. A graph's own pool
        # too: CUDA names those (n, 0) from a counter Python cannot reach, and an id of a counter
        # of our own would be one a real CUDAGraph captured later in the process is given, whose
        # capture_begin then finds the sanitizer's released pool in the allocator (its internal
        # assert `use_count > 0`, seen on the H200). So a graph's own pool is (0, n) here.
        self.pool_handles = PoolHandles(
            self.storage_device, cached=True,
            new_arena=lambda pool_id: AllocatorPool(self.storage_device, pool_id),
            new_user_handle=torch_internals.graph_pool_handle,
            new_graph_handle=torch_internals.graph_pool_handle)
        self._routed: AllocatorPool | None = None
        # The default generator's seed and offset holders of graphs (graph_rng_holders.py): no
        # real CUDAGraph captures here, so CUDA's generator makes none of its own.
        self.rng_holders = GraphRngHolders(_hidden_holder_pair, torch.cuda.default_stream,
                                           _untracked)
        self.capture = None
        self._gc_was_enabled = False
        # Stream races are not tracked here (the GPU runs the streams); the setting decides what a
        # replay that reads memory CUDA reads silently does (cuda_graph.overwritten_read_handler).
        self.races = races
        self.schedule = "issue_order"  # nor a schedule: the GPU runs its streams
        # The streams of the capture under way: its stream and those forked from it (a wait on an
        # event recorded in it). No driver capture runs here, so CUDA cannot say which they are.
        self._capturing: set[tuple[int, int]] = set()
        self.observers: list = []
        # The capture's stream rules on its own thread (sanitizer_threads.py), pushed above the
        # recorder from capture_begin to capture_end.
        self._stream_rules = None
        # The capture's branch races (sanitizer_races.py), while real streams are tracked.
        self.capture_races = None
        # The capture's forks, which must be joined back before it ends (capture_forks.py).
        self.capture_forks: CaptureForks | None = None

    def rng_device(self) -> torch.device:
        return self.storage_device

    def _real_graph(self, generators) -> torch.cuda.CUDAGraph:
        """A real CUDAGraph with `generators` registered, whose capture_begin and capture_end run
        CUDA's own generator prologue and epilogue."""
        graph = self._real_graph_class()
        for generator in generators:
            graph.register_generator_state(generator)
        return graph

    def capture_generator_states(self, generators) -> list:
        """None to mark: the GPU's generators run CUDA's own capture prologue. Where a refused
        capture left them capturing, this capture's prologue and epilogue would end that on CUDA:
        an empty real capture on a side stream runs both (with `generators` registered)."""
        if self._generators_left_capturing:
            graph = self._real_graph(generators)
            with torch.cuda.stream(torch.cuda.Stream()), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "The CUDA Graph is empty"
                graph.capture_begin()
                graph.capture_end()
            self._generators_left_capturing = False
            self._refused.clear()
        return []

    def holder_states(self, generators) -> list[HolderState]:
        """The default generator's state, as the graph holders see it (a generator registered
        with the graph is CUDA's own, whose state object Python cannot name: none of its)."""
        generator = torch.cuda.default_generators[self.storage_device.index]
        return [HolderState(("default", self.storage_device.index), self.storage_device,
                            lambda: (generator.initial_seed(), generator.get_offset()))]

    def end_generators_left_capturing(self) -> int:
        """Nothing to end here: the GPU's generators are CUDA's, as a real capture left them."""
        return 0

    def refuse_capture_on_default_stream(self, generators) -> None:
        """CUDAGraph::capture_begin runs the GPU's generators' capture prologue before it refuses
        the default stream, leaving them capturing: a real capture_begin there does both."""
        graph = self._real_graph(generators)
        try:
            graph.capture_begin()
        except RuntimeError:
            self._generators_left_capturing = True
            # its generators stay registered while it lives: until a capture ends their state
            self._refused.append(graph)
        else:
            graph.capture_end()
            raise RuntimeError("this torch's CUDAGraph.capture_begin accepted the default stream, "
                               "which the emulated graph refuses as CUDA does")

    def graph_reset(self, key: int) -> None:
        """The reset graph's generator holders go (graph_rng_holders.py)."""
        self.rng_holders.graph_reset(key)

    def capture_draws(self):
        """A capture's random ops draw from the GPU's generators, each from the default
        generator's state in use when it was captured (sanitizer_draws.py)."""
        from harness.emulation.sanitizer_draws import SanitizerDraws

        return SanitizerDraws(self.storage_device, on_draw=self._capture_drew)

    def _capture_drew(self) -> None:
        if self.capture is not None:
            self.rng_holders.drew(id(self.capture), self.holder_states(())[0])

    def current_stream(self):
        return torch.cuda.current_stream()

    def default_stream(self):
        return torch.cuda.default_stream()

    def begin_capture(self, graph, stream, pool) -> AllocatorPool:
        """The capture's pool use is its pool (the GPU's allocator knows its device)."""
        pool.begin_routing()
        self.capture, self._capturing, self._routed = graph, {_key(stream)}, pool
        # The recorder's Python objects set the collector off far more often than a real capture
        # does; a collection inside the capture can destroy an unreachable MemPool or CUDAGraph,
        # whose release of its memory CUDA's allocator refuses while a pool is being captured into
        # (an internal assert in a destructor: the process aborted, H100, torch 2.11). Collections
        # wait for the capture's end, as the harness's cuda backend makes them wait.
        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        return pool

    def release_pool(self, pool) -> None:
        pool.release()

    def graph_destroyed(self, key: int) -> None:
        self.rng_holders.graph_destroyed(key)

    def end_capture(self) -> None:
        if self._routed is not None:
            self._routed.end_routing()
        self.capture, self._capturing, self._routed = None, set(), None
        if self._gc_was_enabled:
            gc.enable()

    def is_current_stream_capturing(self) -> bool:
        return self.stream_captures(torch.cuda.current_stream())

    def stream_captures(self, stream) -> bool:
        return self.capture is not None and _key(stream) in self._capturing

    def joins(self, stream) -> None:
        """`stream` waited on work of the capture: it is forked into it, as CUDA counts it."""
        if self.capture is not None:
            self._capturing.add(_key(stream))

    # Observers (DeviceState's interface, state.py) hear of captures and replays here too: the
    # explainer (harness.check.explain_cuda) keeps each capture's recording and observes its replays.

    def notify_replay(self, graph) -> None:
        self._tell("on_replay", graph, torch.cuda.current_stream())

    def issue_replay(self, graph, recording, run) -> None:
        run(recording)

    def notify_capture_begin(self, graph, stream, mode) -> None:
        # No driver capture runs on the real streams, so CUDA enforces none of the capture's
        # stream rules: the sanitizer's own are pushed above the recorder, where they join the
        # capture's thread modes (another thread's routed work meets them too).
        from harness.emulation.sanitizer_races import capture_races
        from harness.emulation.sanitizer_threads import SanitizerStreamRules

        self.capture_races = capture_races(self.memory)
        self.capture_forks = CaptureForks(stream, StreamIds().of, Clocks())
        self._stream_rules = SanitizerStreamRules(self)
        self._stream_rules.__enter__()
        self._tell("on_capture_begin", graph, stream, mode)

    def notify_capture_end(self, graph, *, aborted: bool) -> None:
        """Raises CUDA's unjoined-work error (unless `aborted`) where a fork of the capture was
        not joined back: no driver capture runs to raise it."""
        rules, self._stream_rules = self._stream_rules, None
        forks, self.capture_forks = self.capture_forks, None
        self.capture_races = None
        if rules is not None:
            rules.__exit__(None, None, None)
        error = None if aborted or forks is None else forks.unjoined_error()
        self._tell("on_capture_end", graph, aborted or error is not None)
        if error is not None:
            raise error


class CompiledKernel:
    """A kernel of `torch.cuda._compile_kernel` (NVRTC) under the sanitizer. Its launch goes to the
    driver past torch's dispatcher, where the recorder cannot see it: inside an emulated capture it
    would run once, at capture, and never at replay (a spin-wait kernel would hang the capture).
    So a launch on a capturing stream is refused by name; outside a capture it runs as it is."""

    def __init__(self, kernel, host: SanitizerHost) -> None:
        self._kernel, self._host = kernel, host

    def __call__(self, *args, **kwargs):
        stream = kwargs.get("stream")
        if self._host.stream_captures(torch.cuda.current_stream() if stream is None else stream):
            raise UnsupportedOnEmulatedDevice(
                "a kernel of torch.cuda._compile_kernel() launched during a CUDA graph capture is "
                "not supported by the graph sanitizer (harness.emulate_cuda() on a GPU): it is "
                "launched through the CUDA driver, past the torch ops the sanitizer records, so "
                "it would run once now and never at replay. Capture it natively, or launch it "
                "outside the capture")
        return self._kernel(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._kernel, name)


def _key(stream) -> tuple:
    # the queue: work on an ExternalStream of the capturing stream's handle is captured on CUDA
    return queue_key(stream)


def enter_sanitizer(stack: contextlib.ExitStack, races: str = "strict") -> SanitizerHost:
    import torch.cuda.graphs

    from harness.emulation.cuda_graph import CUDAGraph, dump_graph_dot, torch_cuda_graph_class
    import torch.cuda.memory

    from harness.emulation.active import is_in_force
    from harness.emulation.replacing import apply
    from harness.emulation.sanitizer_threads import thread_start_patch

    host = SanitizerHost(torch.cuda.graphs.CUDAGraph, races)
    real_empty_cache = torch.cuda.memory.empty_cache

    def empty_cache() -> None:
        # CUDA's allocator gives back the unused pools' segments; the emulator's record of which
        # pools' memory may have been handed out again follows (pool.PoolUse).
        real_empty_cache()
        host.pool_handles.release_cached()

    def graph_pool_handle():
        return host.pool_handles.user_handle()

    def is_current_stream_capturing() -> bool:
        return host.is_current_stream_capturing()

    compile_kernel = getattr(torch.cuda, "_compile_kernel", None)

    def compile_kernel_checked(*args, **kwargs):
        return CompiledKernel(compile_kernel(*args, **kwargs), host)

    names = {"CUDAGraph": torch_cuda_graph_class(), "graph_pool_handle": graph_pool_handle,
             "is_current_stream_capturing": is_current_stream_capturing}
    # The graphs' weak references to captured tensors are the harness's, not the program's: a swap
    # of a captured tensor happens as on CUDA and the next replay is refused (watch_refs.py).
    swap = (torch.utils, "swap_tensors", install_swaps_past_watches())
    apply([(module, name, value) for module in (torch.cuda, torch.cuda.graphs)
            for name, value in names.items()]
          + [(module, "empty_cache", empty_cache) for module in (torch.cuda, torch.cuda.memory)]
          # the C++ half under torch's Python class (cuda_api.cuda_graph_base); the host's real
          # graphs keep the real one, bound when torch's class was made
          + [(torch_internals.torch_namespace("torch._C"), "_CUDAGraph", CUDAGraph)]
          + ([(torch.cuda, "_compile_kernel", compile_kernel_checked)] if compile_kernel else [])
          # torch 2.14's DOT dump reads a cudaGraph_t the emulated graphs do not have
          + ([(torch.cuda.graphs, "_dump_graph_dot", dump_graph_dot)]
             if torch_internals.optional_name("cuda_graphs_dump_graph_dot") is not None else [])
          + [swap] + _capture_rules(host) + _cudagraph_trees_refused()
          + sanitizer_compile_patches()
          + thread_start_patch(host, lambda: is_in_force(host)), stack)
    return host


CUDAGRAPH_TREES_REFUSED = (
    "torch.compile(mode='reduce-overhead') (inductor's CUDA graphs) under the graph sanitizer, "
    "harness.emulate_cuda() on a GPU: cudagraph trees keep each graph's inputs and outputs alive "
    "through checkpoints of a real CUDA graph pool in the caching allocator, which the sanitizer's "
    "emulated graphs do not have, so their replays would be refused as reads of freed memory. "
    "Check this code natively, on the emulated device without a GPU (--emulate-cuda there replays "
    "reduce-overhead through its own graphs), or compile it without CUDA graphs "
    "(mode='max-autotune-no-cudagraphs') inside the sanitizer")


def _cudagraph_trees_refused() -> list:
    """Inductor wraps a reduce-overhead graph with these when it compiles it (a graph compiled
    before the sanitizer began keeps torch's own, and meets the refusals of freed memory)."""
    def refused(*args, **kwargs):
        raise UnsupportedOnEmulatedDevice(CUDAGRAPH_TREES_REFUSED)

    return [(torch_internals.lazy_module("inductor_cudagraph_trees"), "cudagraphify_impl", refused),
            (torch_internals.lazy_module("inductor_compile_fx"), "cudagraphify_impl", refused)]


def _capture_rules(host: SanitizerHost) -> list:
    """No real capture runs here, so CUDA itself would let host syncs through, and waits on work
    outside the capture: the sanitizer refuses them as a capture on CUDA does (capture_syncs.py,
    capture_waits.py), with CUDA's text, then makes the call; `record_stream` reaches CUDA's
    allocator during a capture, as it does there."""
    from harness.emulation.capture_syncs import refuse_host_sync
    from harness.emulation.capture_waits import refuse_uncaptured_wait

    Stream, Event = torch.cuda.Stream, torch.cuda.Event
    stream_sync, stream_query = Stream.synchronize, Stream.query
    event_sync, event_query, event_record = Event.synchronize, Event.query, Event.record
    event_elapsed = Event.elapsed_time
    event_wait, stream_wait_stream = Event.wait, Stream.wait_stream
    tensor_record_stream = torch.Tensor.record_stream
    torch_C = torch_internals.torch_namespace("torch._C")
    device_sync = getattr(torch_C, "_cuda_synchronize")

    def synchronize_stream(self) -> None:
        refuse_host_sync(host, "Stream.synchronize()", stream=self)
        stream_sync(self)

    def query_stream(self) -> bool:
        refuse_host_sync(host, "Stream.query()", stream=self)
        return stream_query(self)

    def synchronize_event(self) -> None:
        refuse_host_sync(host, "Event.synchronize()", event=self)
        event_sync(self)

    def query_event(self) -> bool:
        refuse_host_sync(host, "Event.query()", event=self)
        return event_query(self)

    def elapsed_time(self, end_event) -> float:
        # torch's CUDAEvent::elapsed_time queries both events first (C++, past the patch above).
        refuse_host_sync(host, "Event.elapsed_time()", event=self)
        refuse_host_sync(host, "Event.elapsed_time()", event=end_event)
        return event_elapsed(self, end_event)

    def record_event(self, stream=None) -> None:
        event_record(self, stream)
        on = torch.cuda.current_stream() if stream is None else stream
        self.recorded_on = on  # what capture_waits.py asks of an event
        if host.stream_captures(on):
            host.capture.note_recorded_event(self)
        if host.capture_forks is not None:
            forks = host.capture_forks
            forks.clocks.record_event(id(self), forks.key(on))
        if host.capture_races is not None:
            host.capture_races.record_event(self, on)

    def wait_on_event(self, stream=None) -> None:  # Stream.wait_event(e) is e.wait(stream)
        waiting = torch.cuda.current_stream() if stream is None else stream
        refuse_uncaptured_wait(host, waiting, event=self, what="Stream.wait_event()")
        if host.capture is not None and host.capture.recorded_event(self):
            host.joins(waiting)
        event_wait(self, stream)
        if host.capture_forks is not None:
            forks = host.capture_forks
            forks.clocks.wait_event(forks.key(waiting), id(self))
        if host.capture_races is not None:
            host.capture_races.wait_event(waiting, self)

    def wait_stream(self, other) -> None:
        refuse_uncaptured_wait(host, self, other=other, what="Stream.wait_stream()")
        stream_wait_stream(self, other)  # records on `other`, then waits: a fork joins above

    def record_stream(self, stream) -> None:
        # A call on the allocator, not work of the graph: during a capture it goes to CUDA's
        # allocator at once (past the recorder), which then holds the block as it does in a
        # capture (sanitizer_pools.py).
        if host.capture is None:
            tensor_record_stream(self, stream)
            return
        with torch_internals.disable_current_modes():
            tensor_record_stream(self, stream)

    def synchronize_device() -> None:
        refuse_host_sync(host, "torch.cuda.synchronize()", device=True)
        device_sync()

    return [(Stream, "synchronize", synchronize_stream), (Stream, "query", query_stream),
            (Event, "synchronize", synchronize_event), (Event, "query", query_event),
            (Event, "elapsed_time", elapsed_time), (Event, "record", record_event), (Event, "wait", wait_on_event),
            (Stream, "wait_stream", wait_stream), (torch.Tensor, "record_stream", record_stream),
            (torch_C, "_cuda_synchronize", synchronize_device)]


def _hidden_holder_pair(device: torch.device) -> tuple:
    """Two one-element int64 tensors on the GPU's default stream, made where no dispatch mode
    sees them (torch 2.14's first draw of a capture)."""
    with torch.cuda.stream(torch.cuda.default_stream(device)), torch_internals.DisableTorchDispatch():
        return tuple(torch.empty(1, dtype=torch.int64, device=device) for _ in range(2))


def _untracked():
    """The real streams' tracking in force, if any, judges none of the harness's own ops."""
    work = tracking_in_force()
    return contextlib.nullcontext() if work is None else work.untracked()
