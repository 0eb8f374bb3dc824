"""The emulated CUDA device's state while `emulate_cuda()` is active, and the interface that stream
tracking hooks into.

## The observer interface

Every device op, host synchronization and stream/event operation goes through `DeviceState`; an
observer registered with `DeviceState.observe(observer)` hears of each, in issue order, on the
calling thread:

- `on_op(op, args, kwargs, result, stream)`: a torch call that touched device memory (the placement
  mode's view: one call per torch function, `op` the function, e.g. `torch.Tensor.add_`, or a
  string for copies: "Tensor.to", "Tensor.cuda"), with its arguments, its result and the stream it
  was issued to (`state.streams.current()`).
- `on_sync(what, tensor, stream)`: the host waited for the device: a host read of a device tensor
  (`item`, `tolist`, `__bool__`, a copy to the host) or `torch.cuda.synchronize()` (tensor None).
- `on_stream(what, stream, other)`: "wait_stream" (other: a Stream), "wait_event" / "record_event"
  (other: an Event), "synchronize" (other: None), "event_synchronize" (other: the Event), "sleep"
  (`torch.cuda._sleep` on the stream; other: its cycles; also heard by `on_op`).
- `on_host_read(what, tensor)`: the host read a pinned host tensor without the dispatcher
  (`tolist`, `item`, `numpy`): a non_blocking copy into it may still be pending.
- `on_replay(graph, stream)`: a graph replay was issued.
- `on_capture_begin(graph, stream, capture_error_mode)` once the recorder is in place;
  `on_capture_end(graph, aborted)` before it is removed (it may raise when not `aborted`).
- `issue_replay(graph, recording, run, stream)`: the first observer with this method runs the
  replay (`run(recording)`) when its stream gets to it; without one it runs at once.

Observers may implement any subset; a missing method is skipped. Ops are synchronous for now:
when an observer hears of an op, its result is already computed.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from harness import torch_internals
from harness.emulation.blas_workspaces import BlasWorkspaces
from harness.emulation.caching_allocator import round_size, segment_size
from harness.emulation.capture_frees import CaptureFrees
from harness.emulation.cuda_streams import CaptureQueues
from harness.emulation.compiled_trees import TreeGenerations, trees_missing_pieces
from harness.emulation.device_memory import DeviceMemory
from harness.emulation.graph_rng_holders import GraphRngHolders, HolderState, made_pair
from harness.emulation.fft_plans import PlanCaches
from harness.emulation.observers import Observed
from harness.emulation.pool_handles import PoolHandles, RetainedPool
from harness.emulation.custom_ops import CudaOnlyOps
from harness.emulation.triton_launches import LaunchTable
from harness.emulation.tunable_ops import TunableOps


@dataclass(frozen=True)
class DeviceProperties:
    """What `torch.cuda.get_device_properties()` reports for each emulated device."""

    name: str = "NVIDIA H200 (emulated)"
    total_memory: int = 143_771_287_552  # an H200's 141 GB as torch reports it
    major: int = 9
    minor: int = 0
    multi_processor_count: int = 132
    count: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"device_count must be a positive int, got {self.count!r}")
        if not isinstance(self.total_memory, int) or self.total_memory < 1:
            raise ValueError(f"total_memory must be a positive int of bytes, got {self.total_memory!r}")


class _ThreadDevice(threading.local):
    """This thread's current device: a class default, so the hot path's read of a thread that
    never set one is an attribute read, not a failed lookup (`getattr` with a default)."""

    index = 0


class DeviceState(Observed):
    """One emulated CUDA device set (`properties.count` devices sharing one memory registry)."""

    def __init__(self, properties: DeviceProperties) -> None:
        from harness.emulation.cuda_streams import Streams

        self.properties = properties
        self.races = "strict"  # emulate_cuda(races=...), set on entering
        self.schedule = "issue_order"  # emulate_cuda(schedule=...), set on entering
        # CUDA's current device is per host thread, and a new thread starts on device 0
        # (cudaGetDevice), whatever the thread that started it had set
        self._thread_device = _ThreadDevice()
        self.observers: list[Any] = []
        self.streams = Streams(self)
        self.memory = DeviceMemory(self.streams.current, lambda: self.capture)
        # cuBLAS's workspace per (handle, stream), as PyTorch allocates it (blas_workspaces.py)
        self.blas_workspaces = BlasWorkspaces(self.memory, properties.major, lambda: self.capture)
        self.capture = None  # the CUDAGraph being captured, if any
        # torch warns once that it skipped a sync across a capture boundary (backward_streams.py)
        self.warned_stale_capture_sync = False
        from harness.emulation.default_generators import DefaultGenerators
        from harness.emulation.device_draws import Draws

        # torch.cuda.default_generators (default_generators.py), and the random ops' draws from the
        # device's generators (device_draws.py)
        self.default_generators = DefaultGenerators(properties.count,
                                                    self.is_current_stream_capturing)
        self.draws = Draws(self.default_generators, properties.multi_processor_count)
        # The generators' seed and offset holders of graphs (graph_rng_holders.py)
        self.rng_holders = GraphRngHolders(self._hidden_holder_pair, self.streams.default,
                                           self.untracked, self._made_holder_pair)
        self.reporter = None  # (op, message) -> None while the capture lint runs
        self.initialized = False
        self.kind = "cpu"
        self.placement = None  # the placement mode (placement.py), once entered
        # Runs the placement mode's device calls once stream tracking is on (call_patterns.py).
        self.call_runner = None
        # What the device launches, while a torch profiler records CUDA activity (kernel_log.py)
        self.kernel_log = None
        from harness.emulation.autocast import WeightCastCache

        self.autocast_cache = WeightCastCache()  # autocast("cuda")'s weight casts (autocast.py)
        from harness.emulation.autocast_bodies import BodyChecks

        self.autocast_bodies = BodyChecks()  # F's Python bodies run under autocast
        self.tunable_ops = TunableOps()  # torch.cuda.tunable's settings (tunable_ops.py)
        self.cuda_only_ops = CudaOnlyOps()  # custom ops with a Python CUDA kernel only
        self.triton_launches = LaunchTable()  # users' Triton launches (triton_launches.py)
        # reduce-overhead's generations (compiled_trees.py), per host thread: torch's trees keep
        # their managers in thread-local state (`trees`)
        self._trees: Any = weakref.WeakKeyDictionary()
        # reduce-overhead (and inductor's triton.cudagraphs, dynamo's backend="cudagraphs") through
        # torch's own cudagraph trees, where this torch has what they call (a CUDA build); the
        # device's stand-in (compiled_trees.py) on a build without
        self.torchs_trees = not trees_missing_pieces()
        # while a graph runs through torch's trees: its static inputs' storages, which a replay
        # of theirs reads where one was reallocated at its captured address (cuda_graph.py)
        self.trees_static_inputs = None
        self._devices = tuple(torch.device("cuda", i) for i in range(properties.count))
        self.storage_device = torch.device("cpu")  # where device memory really lives
        # CUDA's allocator keeps an unused graph pool's memory until empty_cache() (pool.PoolUse)
        self.pool_handles = PoolHandles(self.storage_device, cached=True,
                                        refuses_released_pools=True)
        self.kernel_device = torch.device("cuda", 0)  # whose kernels' rules a capture applies
        from harness.emulation.pool_checkpoints import PoolCheckpoints, stream_key

        # cudagraph trees' calls into CUDA's allocator: pools, checkpoints (pool_checkpoints.py)
        self.pool_checkpoints = PoolCheckpoints(self)
        self.memory.stream_key = stream_key
        self.sync_debug_mode = 0  # torch.cuda.set_sync_debug_mode: 0 default, 1 warn, 2 error
        # torch.cuda.set_per_process_memory_fraction, per device as CUDA's allocators keep it
        self.memory_fractions: dict[int, float] = {}
        # torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:True")
        self.record_stream_reuse = False
        self.unmodelled_allocator_settings: set[str] = set()  # reported once each (cuda_api.py)
        # torch.set_default_tensor_type(torch.cuda.*Tensor): factories without a device go to the
        # device (legacy_types.py; placement.py reads it)
        self.legacy_default_on_device = False
        self.fft_plans = PlanCaches()  # torch.backends.cuda.cufft_plan_cache's settings
        # torch._C._cuda_attach_out_of_memory_observer's callables, told of each refused allocation
        self.oom_observers: list = []
        self._capture_frees: CaptureFrees | None = None

    @property
    def trees(self) -> TreeGenerations:
        """The calling thread's cudagraph trees' generations: torch's trees keep a manager per
        host thread (inductor's cudagraphify keeps its function thread-local), so a thread's
        runs neither end another thread's generation nor reuse its pool."""
        thread = threading.current_thread()
        trees = self._trees.get(thread)
        if trees is None:
            trees = self._trees[thread] = TreeGenerations()
        return trees

    def every_threads_trees(self) -> list[TreeGenerations]:
        return list(self._trees.values())

    @property
    def current_index(self) -> int:
        """This thread's current device (torch.cuda.current_device())."""
        return self._thread_device.index

    @current_index.setter
    def current_index(self, index: int) -> None:
        self._thread_device.index = index

    @contextlib.contextmanager
    def device_guard(self, index: int) -> Iterator[None]:
        """Device `index` current on this thread for the block, as ATen's device guard makes an
        op's device current while it runs (its allocations and its stream are that device's)."""
        caller = self.current_index
        self.current_index = index
        try:
            yield
        finally:
            self.current_index = caller

    def device_object(self, index: int = 0) -> torch.device:
        """What `tensor.device` answers for a device tensor on device `index`."""
        return self._devices[index]

    def capturing(self) -> bool:
        """True while a capture records, or a lint checks, what a capture would refuse."""
        return self.capture is not None or self.reporter is not None

    def refuse(self, error: Exception) -> None:
        """Raise what a capture refuses; while a lint runs (`reporter` set), report it and go on."""
        if self.reporter is None:
            raise error
        self.reporter(getattr(error, "op", None) or type(error).__name__, str(error))

    # --- what graphs.py's EmulatedCUDAGraph asks of its device -------------------------------

    def current_stream(self):
        return self.streams.current()

    def default_stream(self):
        return self.streams.default()

    def rng_device(self) -> torch.device:
        """The device whose generator a capture's RNG state calls record: the current one."""
        return self._devices[self.current_index]

    def capture_generator_states(self, generators) -> list:
        """The generator states a capture's prologue marks capturing: the current device's
        default generator's (CUDAGraph::capture_begin registers it) and those of `generators`
        (registered with `register_generator_state`)."""
        from harness.emulation.generators import device_generator

        states = [self.draws.defaults.state_in_use(self.current_index)]
        for generator in generators:
            found = device_generator(generator)
            if found is not None and all(found.philox_state is not s for s in states):
                states.append(found.philox_state)
        return states

    def holder_states(self, generators) -> list[HolderState]:
        """The generator states a capture begins with (`capture_generator_states`), as the
        holders of their seed and offset see them."""
        return [self._holder_state(s) for s in self.capture_generator_states(generators)]

    def _holder_state(self, philox_state) -> HolderState:
        return HolderState(philox_state, self.rng_device(),
                           lambda: (philox_state.seed, philox_state.offset))

    @contextlib.contextmanager
    def untracked(self) -> Iterator[None]:
        """The device's own bookkeeping: no stream tracking judges its ops (graph_rng_holders)."""
        with contextlib.ExitStack() as stack:
            for observer in tuple(self.observers):
                hook = getattr(observer, "untracked", None)
                if hook is not None:
                    stack.enter_context(hook())
            yield

    def _made_holder_pair(self, device: torch.device) -> tuple:
        """The holders as CUDA makes them, dispatched (a user's modes see the two `empty` calls),
        through the placement mode: entered again where it is off, as it is while a compiled
        graph's code runs (a capture begun inside a backend's compiled callable)."""
        placement = self.placement
        if placement is None or placement in torch_internals.get_current_function_mode_stack():
            return made_pair(device)
        with placement:
            return made_pair(device)

    def _hidden_holder_pair(self, device: torch.device) -> tuple:
        """Two one-element int64 device tensors allocated on `device`'s default stream, made
        where no dispatch mode sees them (torch 2.14's first draw of a capture)."""
        with torch_internals.DisableTorchFunction(), torch_internals.DisableTorchDispatch():
            pair = tuple(torch.empty(1, dtype=torch.int64) for _ in range(2))
        for t in pair:
            self.memory.adopt(t.untyped_storage(), self.streams.default(device))
        return pair

    def end_generators_left_capturing(self) -> int:
        """Outside any capture, end the capture state a failed capture left on the devices'
        default generators (what a fresh process has); how many were left so."""
        if self.capture is not None:
            return 0
        left = [g.philox_state for g in self.draws.defaults.generators if g.philox_state.capturing]
        for state in left:
            state.capturing = False
        return len(left)

    def refuse_capture_on_default_stream(self, generators) -> None:
        """Nothing more: capture_generator_states already marked the states capturing."""

    def capture_draws(self):
        """How a capture's random ops draw at replay: from the current device's generators."""
        from harness.emulation.device_draws import CaptureDraws

        return CaptureDraws(self.draws, self.current_index, on_draw=self._capture_drew)

    def _capture_drew(self, philox_state) -> None:
        if self.capture is not None:
            self.rng_holders.drew(id(self.capture), self._holder_state(philox_state))

    def graph_reset(self, key: int) -> None:
        """The graph whose `id()` is `key` was reset (CUDAGraph::reset): its captures' generator
        state goes (graph_rng_holders.py)."""
        self.rng_holders.graph_reset(key)

    def begin_capture(self, graph, stream, pool) -> tuple:
        """`graph` captures on `stream` into `pool` (a pool handle: the allocations of the streams
        in the capture come from its private pool, of the capture device's allocator, as
        CUDAGraph::capture_begin names its current device); the pool use the graph holds."""
        self.capture = graph
        self.streams.capturing = CaptureQueues((stream,))
        # a capture into a MemPool's id allocates from the MemPool (on the MemPool's device)
        self.memory.begin_capture_pool(pool, self.pool_handles.id_of(pool), stream,
                                       self.streams.capturing, self.pool_handles.mem_pool_of(pool))
        # Blocks freed after record_stream are held back as CUDA's allocator holds them.
        self._capture_frees = CaptureFrees(self, reuse_after_join=self.record_stream_reuse)
        self.observers.append(self._capture_frees)
        return (getattr(stream, "device_index", 0), pool)

    def end_capture(self) -> None:
        self.capture = None
        self.streams.capturing = CaptureQueues()
        self.memory.end_capture_pool()
        frees, self._capture_frees = self._capture_frees, None
        if frees is not None:
            frees.end()
            self.observers.remove(frees)

    def release_pool(self, use) -> None:
        """A graph holding the pool use `use` (begin_capture's: the capture device and the pool;
        or retain_pool's) was reset or destroyed (maybe by a finalizer in the middle of an
        allocation: a count that only empty_cache() reads)."""
        if isinstance(use, RetainedPool):
            self.memory.device_allocator(use.model_pool.device).release(use.model_pool)
            return
        self.memory.release_capture_pool(*use)

    def retain_pool(self, pool_id: tuple[int, int]) -> RetainedPool:
        """The capturing graph takes a use of the MemPool `pool_id` names (torch 2.14's
        `use_mem_pool` inside a capture): the pool stays in use, its blocks unreleased, until
        the graph gives the use back (`release_pool`), whether the MemPool lives or not."""
        model_pool = self.pool_handles.mem_pool_model(tuple(pool_id))
        if model_pool is None:
            from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice

            raise UnsupportedOnEmulatedDevice(
                f"CUDAGraph._retain_pool({tuple(pool_id)!r}) is not supported by "
                f"harness.emulate_cuda(): the emulated device retains the pools of live "
                f"torch.cuda.MemPools (use_mem_pool inside a capture), and no live MemPool has "
                f"this id")
        self.memory.device_allocator(model_pool.device).use_pool(model_pool)
        return RetainedPool(tuple(pool_id), model_pool)

    def graph_destroyed(self, key: int) -> None:
        """The graph whose `id()` was `key` is gone (after its `release_pool`)."""
        self.rng_holders.graph_destroyed(key)

    def is_current_stream_capturing(self) -> bool:
        return self.capture is not None and self.streams.current() in self.streams.capturing

    def stream_captures(self, stream) -> bool:
        """Whether `stream` takes part in the capture in progress (capture_syncs.py asks)."""
        return self.capture is not None and stream in self.streams.capturing

    def out_of_memory(self, error: Exception) -> Exception:
        """CUDA's out-of-memory error for a cpu allocation that failed (`error`, whose text
        names the bytes asked for)."""
        import re

        asked = re.search(r"allocate (\d+) bytes", str(error))
        return self._out_of_memory(int(asked.group(1)) if asked else float("nan"),
                                   "the host could not allocate it")

    def memory_fraction_of(self, index: int) -> float:
        """The share of device `index` this process may allocate (1.0 until set)."""
        return self.memory_fractions.get(index, 1.0)

    def check_capacity(self, nbytes: int, index: int | None = None) -> None:
        """Raise CUDA's out-of-memory error when `nbytes` more would not fit on device `index`
        (the current one for None), in the share `torch.cuda.set_per_process_memory_fraction`
        allows this process there."""
        index = self.current_index if index is None else index
        fraction = self.memory_fraction_of(index)
        allowed = int(self.properties.total_memory * fraction)
        if nbytes > allowed - self.memory.live_bytes():
            why = (f"the per-process memory fraction {fraction:g} allows "
                   f"{allowed} bytes" if fraction < 1 else "")
            raise self._out_of_memory(nbytes, why, index)

    def _out_of_memory(self, nbytes: float, why: str, index: int | None = None) -> Exception:
        """CUDA's out-of-memory error, after what CUDA's allocator does before raising it: count
        it in `num_ooms` and tell the out-of-memory observers (device, bytes it would reserve,
        the memory allowed or the device's total, free bytes)."""
        from harness.emulation.capacity import ONE_EXA_BYTES, out_of_memory_error

        total = self.properties.total_memory
        index = self.current_index if index is None else index
        free = total - self.memory.live_bytes()
        if not nbytes < ONE_EXA_BYTES:  # refused before the allocator looks (nan included)
            return out_of_memory_error(nbytes, index, total, free, why)
        accounting = self.memory.accounting(index)
        accounting.num_ooms += 1
        fraction = self.memory_fraction_of(index)
        allowed = int(total * fraction) if fraction < 1 else total
        for observer in tuple(self.oom_observers):
            observer(index, segment_size(round_size(int(nbytes))), allowed, free)
        return out_of_memory_error(
            nbytes, index, total, free, why, allocated=accounting.allocated_bytes(),
            reserved=accounting.stat("reserved_bytes", "current"),
            allowed=allowed if fraction < 1 else None)

    # --- the observer interface --------------------------------------------------------------

    # observe() and _tell(): observers.Observed, shared with the graph sanitizer's host.

    def notify_op(self, op, args: tuple, kwargs: dict, result) -> None:
        # Called for every device op: the current stream is looked up only for someone to hear it,
        # and the hooks are gathered by a loop (a comprehension is a call of its own).
        hooks = None
        for observer in self.observers:
            hook = getattr(observer, "on_op", None)
            if hook is not None:
                hooks = [hook] if hooks is None else [*hooks, hook]
        if hooks:
            stream = self.streams.current()
            for hook in hooks:
                hook(op, args, kwargs, result, stream)

    def flag_host_sync(self) -> None:
        """A host sync under `torch.cuda.set_sync_debug_mode`: warned of or refused, as on CUDA."""
        if self.sync_debug_mode:
            from harness.emulation.tools import on_host_sync

            on_host_sync(self.sync_debug_mode)

    def notify_sync(self, what: str, tensor) -> None:
        if tensor is not None:
            self.flag_host_sync()
        self._tell("on_sync", what, tensor, self.streams.current())

    def notify_host_read(self, what: str, tensor) -> None:
        self._tell("on_host_read", what, tensor)

    def notify_stream(self, what: str, stream, other) -> None:
        self._tell("on_stream", what, stream, other)

    def notify_replay(self, graph) -> None:
        self._tell("on_replay", graph, self.streams.current())

    def notify_capture_begin(self, graph, stream, mode: str) -> None:
        self._tell("on_capture_begin", graph, stream, mode)

    def notify_capture_end(self, graph, *, aborted: bool) -> None:
        """Observers may raise (a capture ending with unjoined work) unless `aborted`."""
        for observer in tuple(self.observers):
            hook = getattr(observer, "on_capture_end", None)
            if hook is not None:
                hook(graph, aborted)

    def issue_replay(self, graph, recording, run) -> None:
        """Run `run(recording)`, the replay of `graph`, or hand it to the observer that issues
        replays to their stream (`issue_replay(graph, recording, run, stream)`: stream tracking)."""
        for observer in tuple(self.observers):
            hook = getattr(observer, "issue_replay", None)
            if hook is not None:
                hook(graph, recording, run, self.streams.current())
                return
        run(recording)
