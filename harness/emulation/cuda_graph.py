"""`torch.cuda.CUDAGraph` on the emulator, for the emulated CUDA device and for the graph
sanitizer on a real GPU alike: `capture_begin()` starts a `CaptureSession` (the recorder with
every rule of the backend contract), `capture_end()` ends it, `replay()` re-runs the recording.
torch's own `torch.cuda.graph` and `make_graphed_callables` run on top of it unchanged.

What it needs from the device (`host`): `memory` (which tensors are device memory), `storage_device`
(where the emulator keeps device memory: the cpu, or the real cuda device), `kernel_device`,
`pool_handles` (pool_handles.py), `current_stream()`, `default_stream()`, `begin_capture(graph, stream, pool)`
(which returns the pool use the graph then holds), `end_capture()`,
`release_pool(use)` (a graph holding the pool use `use` was reset or destroyed), `graph_reset(key)` (the
graph whose `id()` is `key` was reset), `graph_destroyed(key)`
(the graph whose `id()` was `key` is gone), `notify_replay(graph)`.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Callable
import warnings
import threading
import weakref

import torch
import torch.cuda.graphs

from harness import torch_internals
from harness.emulation.pool_checkpoints import stream_key
from harness.emulation.pool_handles import RetainedPool
from harness.emulation.active import active_state
from harness.emulation.tracking.races import RaceWarning
from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice
from harness.graphs.base import CaptureError, FreedMemoryError
from harness.graphs.emulator.graph import EmulatedGraph
from harness.graphs.emulator.pool import PoolArena
from harness.graphs.emulator.capture_session import CaptureSession
from harness.emulation.capture_syncs import (invalidated_capture_error, read_outside_capture,
                                             refuse_graph_launch)
from harness.emulation.torch_graph_class import rebased
from harness.emulation.user_mode_stack import below_users_modes, users_modes_suspended
from harness.emulation.conditional_nodes import ConditionalNodeCalls

# torch 2.11's CUDAGeneratorState kept one `capturing_` flag, set by a capture's prologue and
# cleared only by the epilogue of a capture that ended: a failed capture left every eager draw
# raising "Offset increment outside graph capture encountered unexpectedly". torch 2.12 keyed the
# capture state by capture id (pytorch/pytorch#176752, fixing #171263; 2.13's headers have no
# `capturing_`), so eager draws work after a failed capture. No Python name came with that change;
# `UntypedStorage._swap_data_ptr_` came in the same release and marks it.
FAILED_CAPTURES_LEAVE_GENERATORS_CAPTURING = (
    torch_internals.optional_name("storage_swap_data_ptr") is None)


CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")
_CAPTURE_BEGIN_OPTIONS = {"check_input_liveness"}


class EmulatedCUDAGraph(ConditionalNodeCalls):
    """torch.cuda.CUDAGraph's API (see the module docstring), with the conditional-node calls of
    this build (conditional_nodes.py). `host` is the device it captures on."""

    def __init__(self, host, keep_graph: bool = False) -> None:
        self._host = host
        self._keep_graph = bool(keep_graph)
        self._arena: PoolArena | None = None
        self._pool_id: tuple[int, int] | None = None  # CUDA's id of the arena (pool_handles.py)
        self._session: CaptureSession | None = None
        self._graph: EmulatedGraph | None = None
        self._captured = False
        # CUDA's has_graph_exec_: made by capture_end() unless keep_graph, else by instantiate()
        # or the first replay.
        self._instantiated = False
        # capture_end_pre() to capture_end_post() (keep_graph=False) or reset(): CUDA's template,
        # the cudaGraph_t that raw_cuda_graph() names (builds that split capture_end).
        self._template_live = False
        # The capture was dropped by capture_end_pre() while the captured code's exception
        # propagated: nothing to instantiate or finalize.
        self._dropped = False
        self._debug = False
        self._trace = False
        self._replay_observer = None
        self.capture_error_mode: str | None = None
        self.capture_thread: int | None = None  # the thread that began the capture
        self._capture_stream = None  # the stream its last capture began on
        # The dispatch modes the capture under way pushed on the thread that began it, bottom
        # first: another thread's work on a capturing stream passes through them too
        # (capture_threads.py).
        self._thread_modes: tuple = ()
        # The first refused call of the capture in progress (capture_syncs.py), and the events
        # recorded on its streams: querying those conflicts with the capture in every mode.
        self._invalidation: CaptureError | None = None
        self._recorded_events: list = []
        # An error CUDA recorded with the capture in progress (a conditional node's body that
        # drew random numbers, conditional_nodes.py): capture_end() raises it again.
        self._capture_error: RuntimeError | None = None
        self.replay_segments: tuple = ()  # the recording's, cut at its event nodes (recorder.py)
        # The pool whose use this graph holds (from capture_begin to reset or destruction), in a
        # list its finalizer shares without keeping the graph alive.
        self._pool_in_use: list = []
        self._generators: list[torch.Generator] = []  # registered with register_generator_state
        self._generator_states: list = []  # whose capture prologue ran, for the epilogue
        self._finalizer: weakref.finalize | None = None

    # --- capture -----------------------------------------------------------------------------

    def capture_begin(self, pool=None, capture_error_mode: str = "global", **options) -> None:
        host = self._host
        unknown = set(options) - _CAPTURE_BEGIN_OPTIONS
        if unknown:
            raise TypeError(f"capture_begin() got unexpected keyword arguments {sorted(unknown)}; "
                            f"accepted: pool, capture_error_mode, "
                            f"{', '.join(sorted(_CAPTURE_BEGIN_OPTIONS))}")
        if capture_error_mode not in CAPTURE_ERROR_MODES:
            raise RuntimeError(f"Unknown capture_error_mode {capture_error_mode!r}. Expected "
                               f"`global`, `thread_local`, or `relaxed`")
        if self._captured or self._session is not None:
            raise RuntimeError("This CUDAGraph instance already owns a captured graph. To capture "
                               "a new graph, create a new instance.")
        if host.capture is not None:
            raise CaptureError("capture_begin() while another graph is being captured: CUDA "
                               "allows one capture at a time in the process here (the emulator "
                               "records one capture at a time)", op="capture_begin")
        stream = host.current_stream()
        if self._finalizer is None:
            self._finalizer = weakref.finalize(self, _graph_gone, host, id(self), self._pool_in_use)
        # CUDAGraph::capture_begin runs its generators' capture prologue before it checks the
        # stream: up to torch 2.11 a capture refused on the default stream leaves them capturing
        # (see device_rng.PhiloxState.capturing), until a later capture's epilogue, and has
        # registered the graph and filled their seed and offset holders (graph_rng_holders.py).
        holder_states = host.holder_states(self._generators)
        for generator_state in host.capture_generator_states(self._generators):
            generator_state.capturing = True
            self._generator_states.append(generator_state)
        host.rng_holders.capture_prologue(id(self), holder_states)
        if stream == host.default_stream():
            host.refuse_capture_on_default_stream(self._generators)
            if not FAILED_CAPTURES_LEAVE_GENERATORS_CAPTURING:
                self._generator_epilogue()
            raise RuntimeError("CUDA graphs must be captured on a non-default stream. (However, "
                               "after capture, it's ok to replay them on the default stream.)")
        pool_id, arena = host.pool_handles.arena(pool)
        session = CaptureSession(arena, host.storage_device, memory=host.memory,
                                 kernel_device=host.kernel_device, report_capturing=False,
                                 trace=self._trace, rng_device=host.rng_device(),
                                 # the emulated device's (the sanitizer's compiled kernels would
                                 # run on the GPU, unseen by the recorder)
                                 compiled_code_runs=host.storage_device.type == "cpu")
        # The emulated device's random ops draw from its generators at each replay (device_draws.py).
        session.recorder.draws = host.capture_draws()
        session.recorder.allocation_stream = lambda: stream_key(host.current_stream())
        # Outside strict race checking a replay may read memory freed since capture, as on CUDA:
        # the recording keeps such memory's bytes at its free (graphs/emulator/external.py).
        session.recorder.keep_freed_bytes(host.races != "strict")
        session.reads_outside = lambda what: read_outside_capture(host, what)
        # Set before the host names this graph its capture: another thread may ask at once.
        self.capture_error_mode, self.capture_thread = capture_error_mode, threading.get_ident()
        self._invalidation, self._recorded_events, self._capture_error = None, [], None
        # torch 2.12-2.13 make the generators' holders once the capture began, on the default
        # stream: before the emulated capture begins, which would record them.
        host.rng_holders.capture_began(id(self), holder_states)
        pool_use = host.begin_capture(self, stream, arena)
        self._capture_stream = stream
        self._pool_in_use.append(pool_use)
        # The capture's modes go in below a user's dispatch modes: on CUDA those see the
        # captured ops, not the capture's bookkeeping (user_mode_stack.py).
        with below_users_modes():
            below = len(torch_internals.get_current_dispatch_mode_stack())
            try:
                session.begin()
            except BaseException:
                host.end_capture()
                self._release_pool()
                raise
            host.notify_capture_begin(self, stream, capture_error_mode)
            self._thread_modes = tuple(torch_internals.get_current_dispatch_mode_stack()[below:])
        session.recorder.trace = session.recorder.trace or self._trace  # an observer may ask for it
        session.recorder.registered_generators = tuple(self._generators)
        self._arena, self._session, self._pool_id = arena, session, pool_id
        self.capture_error_mode = capture_error_mode

    def capture_end(self) -> None:
        """CUDAGraph::capture_end: end the capture, instantiate unless keep_graph, finalize."""
        self.capture_end_pre()
        if not self._dropped and not self._keep_graph:
            self._instantiated = True
        self.capture_end_post()

    def capture_end_post(self) -> None:
        """CUDAGraph::capture_end_post: with keep_graph=False the template is destroyed (the
        graph was instantiated by capture_end, or by torch's Python half just before)."""
        if not self._keep_graph:
            self._template_live = False

    def capture_end_pre(self) -> None:
        """CUDAGraph::capture_end_pre: end the capture and keep the template, not instantiated."""
        session = self._session
        # CUDAGraph::capture_end checks the stream before anything else, a second call included;
        # inside a conditional node's body CUDA has the body's own stream current.
        if ((self._capture_stream is not None
             and self._host.current_stream() != self._capture_stream)
                or (session is not None and session.recorder.conditionals)):
            raise RuntimeError("Capture must end on the same stream it began on.")
        if session is None:
            raise RuntimeError("capture_end() called before capture_begin().")
        self._session = None
        with below_users_modes():  # the capture's modes come out from below the user's
            self._end_session(session)

    def _end_session(self, session: CaptureSession) -> None:
        """capture_end_pre() once its checks passed: end `session` and make the graph."""
        # CUDAGraph::capture_end runs the generators' epilogue only after cudaStreamEndCapture
        # succeeds: up to torch 2.11 a capture that ends invalidated (or with unjoined work)
        # leaves them capturing, and every eager draw fails until a later capture ends (H100,
        # torch 2.11); later builds draw on (FAILED_CAPTURES_LEAVE_GENERATORS_CAPTURING).
        ended = False
        try:
            invalidation = self._invalidation or session.recorder.sync_refusal
            if sys.exc_info()[1] is not None:
                # Called from torch.cuda.graph's __exit__ while the captured code's exception
                # propagates. CUDA's cudaStreamEndCapture still runs: where a refused call
                # invalidated the capture it fails, and the caller sees that error with the
                # captured code's as its context (H100, torch 2.11); otherwise the captured
                # code's exception is the one the caller sees.
                self._drop_capture(session)
                ended = invalidation is None
                self._dropped = True
                if invalidation is not None:
                    raise invalidated_capture_error(invalidation)
                return
            if self._capture_error is not None:
                self._drop_capture(session)
                raise RuntimeError(str(self._capture_error))
            if invalidation is not None:
                self._drop_capture(session)
                raise invalidated_capture_error(invalidation)
            try:
                self._host.notify_capture_end(self, aborted=False)  # may raise: unjoined work
            except BaseException:
                self._drop_capture(session, told_host=True)
                raise
            ended = True
            recording = session.end(stacklevel=5)
        finally:
            self._host.end_capture()
            if ended or not FAILED_CAPTURES_LEAVE_GENERATORS_CAPTURING:
                self._generator_epilogue()
            else:
                self._generator_states = []
        self._graph = EmulatedGraph(None, self._arena, recording.steps, recording.inference_mode,
                                    recording.external, recording.records,
                                    reads=recording.reads, writes=recording.writes,
                                    tensors=recording.tensors, allocated=recording.allocated,
                                    shared=recording.shared,
                                    on_overwritten_read=overwritten_read_handler(self._host.races),
                                    on_freed_read=freed_read_handler(self._host.races))
        self.replay_segments = recording.segments  # what stream tracking cuts a replay into
        self._captured = True
        self._dropped = False
        self._template_live = True
        self._instantiated = False

    def _drop_capture(self, session, told_host: bool = False) -> None:
        """End `session` without a graph and give its pool back; `told_host`: the host already
        heard of the capture's end (and refused it)."""
        if not told_host:
            self._host.notify_capture_end(self, aborted=True)
        session.abort()
        self._release_pool()

    @property
    def thread_modes(self) -> tuple:
        """The dispatch modes this graph's capture under way pushed on the thread that began it,
        bottom first (its recorder, the capture's stream rules); () outside a capture."""
        return self._thread_modes if self._session is not None else ()

    def invalidate(self, error: CaptureError) -> None:
        """A call CUDA refuses during capture was made (capture_syncs.py): as on CUDA, the capture
        is invalidated and `capture_end()` fails, even when the caller caught `error`."""
        if self._invalidation is None:
            self._invalidation = error
        if self._session is not None:
            self._session.recorder.refuse_sync(error)

    def note_recorded_event(self, event) -> None:
        """`event` was recorded on a stream of this graph's capture. One made with
        `external=True` is a node of the graph (cudaEventRecordExternal): each replay records
        it again once the work captured before it ran."""
        self._recorded_events.append(event)
        if getattr(event, "external", False) and self._session is not None:
            self._session.recorder.cut_at_event(event)

    def recorded_event(self, event) -> bool:
        """Whether `event` was last recorded inside this graph's capture."""
        return any(e is event for e in self._recorded_events)

    def keep_trace(self) -> None:
        """Keep, per op of this graph's capture, its source line, arguments and outputs
        (emulator/trace.py), so that `recording.records` and `replay_observed` can show each op's
        results (harness.check.explain). Call it before the capture or during it before its first
        op (an observer's `on_capture_begin`)."""
        self._trace = True
        if self._session is not None:
            self._session.recorder.trace = True

    # --- after capture -----------------------------------------------------------------------

    @property
    def recording(self) -> EmulatedGraph | None:
        """The finished capture: an `EmulatedGraph` with `records` (one `OpRecord` per op when
        `keep_trace()` was called, else none), `replay_observed`, `first_use`, `reads`, `writes`; None
        before a successful capture and after `reset()`."""
        return self._graph

    def replay_observed(self, before, after) -> None:
        """`replay()`, calling `before(record)` ahead of each recorded op and `after(record)` once
        its outputs hold its results (`EmulatedGraph.replay_observed`), issued like `replay()`."""
        graph = self._graph
        if graph is None:
            raise RuntimeError("Called CUDAGraph::replay_observed without a preceding successful capture.")
        refuse_graph_launch(self._host, "CUDAGraph.replay()")
        self._replay_prologue()
        self._host.notify_replay(self)

        def run(recording: EmulatedGraph) -> None:
            with torch_internals.DisableTorchFunction():
                recording.replay_observed(before, after)

        self._launch(graph, run)

    def replay(self) -> None:
        graph = self._graph
        if graph is None:
            raise RuntimeError("Called CUDAGraph::replay without a preceding successful capture.")
        static = getattr(self._host, "trees_static_inputs", None)
        if static is not None:
            # torch's cudagraph trees replay a recording whose static inputs are at the addresses
            # it captured (they compare data pointers, not buffers): a parameter reassigned with
            # `.data = ...` whose new memory landed where the old one was freed is read there
            graph.adopt_reallocated(static)
        self._instantiated = True
        refuse_graph_launch(self._host, "CUDAGraph.replay()")
        self._replay_prologue()
        self._host.notify_replay(self)
        observer = self._replay_observer
        if observer is None:
            # A profiler recording CUDA activity sees the launch and each node (kernel_log.py).
            log = getattr(self._host, "kernel_log", None)
            self._launch(graph, self._run if log is None else self._bracketed(log.run_graph))
            return

        def observed(recording: EmulatedGraph) -> None:
            with torch_internals.DisableTorchFunction():
                observer(recording)

        self._launch(graph, observed)

    def _replay_prologue(self) -> None:
        """CUDAGraph::replay's generator prologue, before the launch: the holders of the states
        the graph drew from are filled, on the capture device's current stream, where the
        user's dispatch modes see it (graph_rng_holders.py)."""
        with self._on_capture_device():
            self._host.rng_holders.replay_prologue(id(self))

    def _launch(self, graph: EmulatedGraph, run: Callable[[EmulatedGraph], None]) -> None:
        """Issue `run(graph)` as CUDA launches a graph: on the current stream of its capture's
        device, one launch that no dispatch mode of the user's sees (user_mode_stack.py)."""
        with self._on_capture_device(), users_modes_suspended():
            self._host.issue_replay(self, graph, run)

    def _on_capture_device(self):
        """CUDAGraph::replay launches on the current stream of the device the graph was captured
        on (a device guard on its capture stream's device), whichever device the caller has
        current: a graph of cuda:1 replayed with cuda:0 current runs on cuda:1's stream."""
        index = getattr(self._capture_stream, "device_index", None)
        if index is None or index == torch.cuda.current_device():
            return contextlib.nullcontext()
        return torch.cuda.device(index)

    def observe_replays(self, observer) -> None:
        """From now on each `replay()` runs `observer(recording)` in place of the plain replay
        (harness.check.explain_cuda runs `recording.replay_observed` there); None restores it."""
        self._replay_observer = observer

    @staticmethod
    def _bracketed(run: Callable[[EmulatedGraph], None]) -> Callable[[EmulatedGraph], None]:
        def without_placement(graph: EmulatedGraph) -> None:
            with torch_internals.DisableTorchFunction():
                run(graph)
        return without_placement

    @staticmethod
    def _run(graph: EmulatedGraph) -> None:
        # The recording is aten calls on the memory captured; the placement mode has nothing
        # to decide there.
        with torch_internals.DisableTorchFunction():
            graph.replay()

    def _generator_epilogue(self) -> None:
        for generator_state in self._generator_states:
            generator_state.capturing = False
        self._generator_states = []

    def reset(self) -> None:
        self._host.graph_reset(id(self))
        if self._session is not None:
            with below_users_modes():
                self._host.notify_capture_end(self, aborted=True)
                self._session.abort()
            self._session = None
            self._host.end_capture()
            self._generator_epilogue()
        self._release_pool()
        if self._graph is not None:
            self._graph.reset()  # gives its pool's use back (pool.PoolUse)
        self._graph = None
        self._captured = False
        self._instantiated = False
        self._template_live = False
        self._dropped = False

    def _release_pool(self) -> None:
        while self._pool_in_use:
            self._host.release_pool(self._pool_in_use.pop())

    def pool(self) -> tuple[int, int]:
        """CUDA's id of this graph's pool, an (int, int) tuple another capture may share."""
        if self._pool_id is None:
            raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
        return self._pool_id

    def pools(self) -> list[tuple[int, int]]:
        """CUDA's ids of the pools this graph holds: its own, once captured, and those it retained
        (`_retain_pool`), until it is reset."""
        if self._pool_id is None or not self._pool_in_use:
            return []
        return [self._pool_id, *(use.pool_id for use in self._pool_in_use
                                 if isinstance(use, RetainedPool))]

    def _retain_pool(self, pool_id) -> None:
        """CUDAGraph::_retain_pool (torch 2.14's `use_mem_pool` inside a capture): hold a use of
        the pool `pool_id` names until this graph is reset or destroyed."""
        retain = getattr(self._host, "retain_pool", None)
        if retain is None:
            raise UnsupportedOnEmulatedDevice(
                "CUDAGraph._retain_pool() is not supported by the graph sanitizer: its pools are "
                "CUDA's own allocator's, which it does not ask to retain one for a graph")
        self._pool_in_use.append(retain(pool_id))

    @staticmethod
    def get_currently_capturing_graph() -> "EmulatedCUDAGraph":
        """The graph capturing on the current stream (CUDAGraph::get_currently_capturing_graph)."""
        host = active_state()
        if not host.is_current_stream_capturing():
            raise RuntimeError("get_currently_capturing_graph() called while the current stream "
                               "is not capturing a CUDA graph")
        return host.capture

    @property
    def _has_graph_exec(self) -> bool:
        """Whether the graph is instantiated (CUDAGraph's has_graph_exec_)."""
        return self._instantiated

    def instantiate(self) -> None:
        """CUDAGraph.cpp's checks; the recording itself needs no instantiation."""
        if self._dropped and sys.exc_info()[1] is not None:
            return  # the capture was dropped for the exception torch.cuda.graph's exit re-raises
        if not self._captured:
            raise RuntimeError("capture_end() must have been called before calling instantiate")
        if self._instantiated and not self._keep_graph:
            raise RuntimeError("instantiate() is intended to be called by the user only when "
                               "keep_graph=true")
        self._instantiated = True

    @property
    def num_ops(self) -> int:
        return 0 if self._graph is None else self._graph.num_ops

    def register_generator_state(self, generator) -> None:
        """Let the captured work draw from `generator` besides the device's default one, as on
        CUDA: each replay draws fresh values from it (an unregistered one is refused at capture,
        emulator/private_generators.py)."""
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"register_generator_state() takes a torch.Generator, got "
                            f"{type(generator).__name__}")
        if not any(generator is g for g in self._generators):
            self._generators.append(generator)
            # up to torch 2.11 the generator's state registers the graph now (its holders)
            for state in self._host.holder_states([generator])[1:]:
                self._host.rng_holders.register(id(self), state)
        if self._session is not None:
            self._session.recorder.registered_generators = tuple(self._generators)

    @property
    def registered_generators(self) -> tuple:
        """The generators registered with this graph (for harness.check.capture_lint)."""
        return tuple(self._generators)

    def enable_debug_mode(self) -> None:
        """An emulated graph keeps its recording anyway; this allows debug_dump(), as on CUDA."""
        self._debug = True

    def debug_dump(self, debug_path: str, *, verbose: bool = True) -> None:
        """Up to torch 2.13 (the C++ half's): write the recording as a Graphviz DOT file if the
        graph was captured in debug mode (`dump_template` below: torch 2.14's dump)."""
        if not (self._debug or self._keep_graph):
            warnings.warn("CUDA Graphs debug not enabled, set with [graph].enable_debug_mode()",
                          stacklevel=2)
            return
        if self._graph is None:
            return  # CUDA dumps nothing without a graph, and says nothing either
        self._write_dot(debug_path)

    def dump_template(self, path: str) -> None:
        """torch 2.14's DOT dump of the template (cudaGraphDebugDotPrint on `raw_cuda_graph()`):
        refused, in its words, once the template is gone; else the recording, as `debug_dump`."""
        if not self._template_live:
            raise RuntimeError(_NO_TEMPLATE)
        self._write_dot(path)

    def _write_dot(self, path: str) -> None:
        """One node per recorded call, in replay order (an emulated graph is a sequence; CUDA's
        dump shows its kernel nodes)."""
        lines = ["digraph emulated_cuda_graph {"]
        for i, (fn, _, _) in enumerate(self._graph._steps or ()):
            name = str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or fn)
            lines.append(f'  n{i} [label="{name}"];')
            if i:
                lines.append(f"  n{i - 1} -> n{i};")
        lines.append("}")
        with open(path, "w") as out:
            out.write("\n".join(lines) + "\n")

    def raw_cuda_graph(self) -> int:
        if TEMPLATE_SPLIT:
            # torch 2.14's rule: the template lives from capture_end_pre to capture_end_post
            # (a capture-end hook sees it whatever keep_graph), or until reset with keep_graph.
            if not self._template_live:
                raise RuntimeError(_NO_TEMPLATE)
            raise UnsupportedOnEmulatedDevice(_NO_CUDA_GRAPH.format("raw_cuda_graph()"))
        if not self._keep_graph:
            raise RuntimeError("You cannot access the raw cudaGraph_t instance unless CUDAGraph "
                               "was initialized with keep_graph=true")
        if not self._captured:
            raise RuntimeError("You cannot access the raw cudaGraph_t instance until "
                               "capture_end() has been called")
        raise UnsupportedOnEmulatedDevice(_NO_CUDA_GRAPH.format("raw_cuda_graph()"))

    def raw_cuda_graph_exec(self) -> int:
        if not self._instantiated:
            raise RuntimeError("You cannot access the raw cudaGraphExec_t instance until "
                               "instantiate() has been called")
        raise UnsupportedOnEmulatedDevice(_NO_CUDA_GRAPH.format("raw_cuda_graph_exec()"))


def dump_graph_dot(cuda_graph, path: str, *, verbose: bool = True) -> None:
    """torch.cuda.graphs._dump_graph_dot inside the emulation (torch 2.14: what `debug_dump()` and
    `torch.cuda.graphs.export_dot`'s capture-end hook call). torch's needs cuda-bindings and
    refuses without them, as here; then it prints the template through the CUDA runtime, which
    an emulated graph writes from its recording."""
    require_bindings = torch_internals.optional_name("cuda_graphs_require_bindings")
    if require_bindings is not None:
        require_bindings()
    cuda_graph.dump_template(path)


def _graph_gone(host, key: int, pool_in_use: list) -> None:
    """A graph was destroyed: as CUDA's destructor, reset (release its pool) and unregister it."""
    while pool_in_use:
        host.release_pool(pool_in_use.pop())
    host.graph_destroyed(key)


_NO_CUDA_GRAPH = ("CUDAGraph.{} is not supported by harness.emulate_cuda(): an emulated graph is a "
                  "recording of torch ops, there is no cudaGraph_t to show (nor a CUDA driver to "
                  "hand one to: cuda-bindings' cudaGraphGetNodes and the like need a GPU)")


def overwritten_read_handler(races: str) -> Callable[[FreedMemoryError], None] | None:
    """What a replay reading shared-pool memory another graph overwrote does on this device: CUDA
    reads the other graph's values silently, as a race gives wrong values silently, so the races
    setting decides: refused (`strict`), warned of and replayed with CUDA's values (`report`, a
    `RaceWarning`), replayed (`off`)."""
    return _silent_read_handler(races, "the replay reads what CUDA reads")


def freed_read_handler(races: str) -> Callable[[FreedMemoryError], None] | None:
    """What a replay reading memory freed since capture (whose bytes the recording kept at the
    free) does on this device: CUDA reads the freed block silently (its bytes as they were,
    until the allocator hands the block to a later allocation), so the races setting decides, as
    for overwritten shared-pool memory: refused (`strict`), warned of and replayed on the kept
    bytes (`report`), replayed (`off`)."""
    return _silent_read_handler(races, "the replay reads and writes the bytes the memory held "
                                       "when it was freed, as CUDA's replay does until its "
                                       "allocator hands the block to a later allocation")


def _silent_read_handler(races: str, reads: str) -> Callable[[FreedMemoryError], None] | None:
    """None under strict races (the replay raises); else what replays anyway, warning under
    `report` of the error and of what the replay reads (`reads`)."""
    if races == "strict":
        return None
    if races == "off":
        return lambda error: None

    def warn(error: FreedMemoryError) -> None:
        warnings.warn(RaceWarning(f"FreedMemoryError (reported, not raised: races='report'; "
                                  f"{reads}): {error}"), stacklevel=4)

    return warn


class CUDAGraph(EmulatedCUDAGraph):
    """A graph on the active device: the emulated `_CUDAGraph`, the C++ half under torch's
    Python CUDAGraph class (torch_graph_class.py), and the harness's own graphs."""

    def __new__(cls, keep_graph: bool = False):
        # torch's Python half calls super().__new__(cls, keep_graph), as _CUDAGraph takes it.
        return super().__new__(cls)

    def __init__(self, keep_graph: bool = False) -> None:
        super().__init__(active_state(), keep_graph)


# This build's Python CUDAGraph, taken before an emulation replaces torch.cuda.graphs.CUDAGraph.
TORCH_CUDA_GRAPH = torch.cuda.graphs.CUDAGraph
_NO_TEMPLATE = ("No cudaGraph_t is available: either capture_end() has not been called, or the "
                "underlying cudaGraph_t was destroyed (keep_graph=false, and capture has been "
                "finalized).")
# Whether this build splits capture_end into capture_end_pre/_post (torch 2.14), which came with
# the template rule of raw_cuda_graph() above.
TEMPLATE_SPLIT = hasattr(TORCH_CUDA_GRAPH, "capture_end_pre")
_BUILT: list[type] = []


def torch_cuda_graph_class() -> type:
    """What `torch.cuda.CUDAGraph` is inside emulate_cuda(): this build's Python class over
    `CUDAGraph` above (made once)."""
    if not _BUILT:
        _BUILT.append(rebased(TORCH_CUDA_GRAPH, CUDAGraph))
    return _BUILT[0]


