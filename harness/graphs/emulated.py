"""CUDA-graph semantics without CUDA: capture records aten ops (recorder.py) into a pool arena
(pool.py); replay re-runs the recording, allocation-free, against the captured storages."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from harness.graphs.base import CapturedGraph, GraphBackend, released_graph_error
from harness.graphs.cuda import CudaGraph
from harness.graphs.emulator.external import ExternalStorage, freed_error, moved_error
from harness.graphs.emulator.opinfo import ReplayStep
from harness.graphs.emulator.pool import PoolArena
from harness.graphs.emulator.recorder import Recorder
from harness.graphs.emulator.capture_session import CaptureSession
from harness.graphs.emulator.trace import OpRecord


# StorageWeakRef.expired() without its Python method call: one C call per storage at each replay;
# the address check is C calls too (dereference the storage objects, read their data pointers).
_expired = torch.UntypedStorage._expired
_data_ptr = torch.UntypedStorage.data_ptr


class EmulatedGraph(CapturedGraph):
    def __init__(self, output: Any, pool: PoolArena, steps: list[ReplayStep],
                 inference_mode: bool, external: list[ExternalStorage],
                 records: list[OpRecord] | None = None, *,
                 reads: frozenset[int] = frozenset(), writes: frozenset[int] = frozenset()) -> None:
        self.output = output
        self.pool = pool
        self._steps: list[ReplayStep] | None = steps
        self._inference_mode = inference_mode
        self.reads = reads  # the storages a replay reads and writes, for stream tracking
        self.writes = writes
        self._external = external  # holds the weak references the raw pointers below stand for
        self._external_weak_refs = tuple(s.liveness.cdata for s in external)
        self._external_objects = tuple(s.storage_object for s in external)
        self._external_addresses = tuple(s.address for s in external)
        self.records: tuple[OpRecord, ...] = tuple(records or ())

    @property
    def num_ops(self) -> int:
        """How many recorded calls a replay makes (views and `empty` need none)."""
        return len(self._steps or ())

    def replay(self) -> None:
        steps = self.refuse_unreplayable()
        # Autograd never sees a graph's work (as on CUDA); inference mode is kept as captured
        # because capture-time outputs are inference tensors exactly when it was on.
        with torch.inference_mode(self._inference_mode), torch._C._AutoDispatchBelowADInplaceOrView():
            for fn, args, kwargs in steps:
                fn(*args, **kwargs)

    def replay_in_steps(self) -> list[Callable[[], None]]:
        """`replay()` cut at each recorded call, for a stream schedule that interleaves the
        replay with other streams' work (two graphs replayed concurrently, as on a GPU)."""
        steps = self.refuse_unreplayable()
        inference = self._inference_mode

        def step(fn, args, kwargs) -> Callable[[], None]:
            def run() -> None:
                with torch.inference_mode(inference), torch._C._AutoDispatchBelowADInplaceOrView():
                    fn(*args, **kwargs)
            return run

        return [step(*s) for s in steps]

    def replay_observed(self, before: Callable[[OpRecord], Any],
                        after: Callable[[OpRecord], Any]) -> None:
        """`replay()`, calling `before(record)` ahead of each recorded op's replay call and
        `after(record)` once its outputs hold its results (for harness.check.explain)."""
        steps = self.refuse_unreplayable()
        by_step: dict[int, list[OpRecord]] = {}
        for record in self.records:
            by_step.setdefault(record.step, []).append(record)
        with torch.inference_mode(self._inference_mode), torch._C._AutoDispatchBelowADInplaceOrView():
            for index, (fn, args, kwargs) in enumerate(steps):
                records = by_step.get(index, ())
                for record in records:
                    before(record)
                fn(*args, **kwargs)
                for record in records:
                    after(record)

    def first_use(self, address: int) -> str:
        """Where the capture first used the external storage that holds `address`, or ""."""
        for storage in self._external:
            start = storage.replay_storage.data_ptr()
            if start <= address < start + storage.replay_storage.nbytes():
                return storage.first_use
        return ""

    def refuse_unreplayable(self) -> list[ReplayStep]:
        """The steps to replay, or the error a replay raises (released, freed or moved memory)."""
        steps = self._steps
        if steps is None:
            raise released_graph_error()
        if any(map(_expired, self._external_weak_refs)):
            raise freed_error(next(s for s in self._external if s.liveness.expired()))
        if self._external_addresses:
            storages = [ref() for ref in self._external_objects]
            if None in storages:
                raise freed_error(next(s for s in self._external if s.storage_object() is None))
            if tuple(map(_data_ptr, storages)) != self._external_addresses:
                raise moved_error(next(s for s in self._external if s.moved()))
        return steps

    def external_storages(self) -> list[torch.UntypedStorage]:
        """The live storages the graph uses but does not own (to keep them alive a while)."""
        return [s for s in (ref() for ref in self._external_objects) if s is not None]

    def reset(self) -> None:
        self._steps = None


class EmulatedBackend(GraphBackend):
    name = "emulated"

    def __init__(self, device: torch.device | str | None = None, *, trace: bool = False) -> None:
        """`trace`: keep, per recorded op, its source line, arguments and outputs, so that
        `EmulatedGraph.replay_observed` can show each op's results (harness.check.explain)."""
        self.trace = trace
        device = torch.device("cpu" if device is None else device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self._stream = None  # the side stream of captures through torch.cuda.graph

    def graph_pool_handle(self) -> Any:  # a PoolArena; inside emulate_cuda() CUDA's (int, int) pool id
        if self._through_torch_cuda():
            return torch.cuda.graph_pool_handle()
        return PoolArena(self.device)

    def _through_torch_cuda(self) -> bool:
        """Inside emulate_cuda() a cuda device's graphs are torch.cuda's (the emulated CUDAGraph):
        captured as code written for CUDA captures them, on a side stream."""
        from harness.emulation import emulation_active

        return self.device.type == "cuda" and emulation_active() is not None

    def is_capturing(self) -> bool:
        return any(isinstance(mode, Recorder) for mode in _get_current_dispatch_mode_stack())

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _capture(self, fn: Callable[[], Any], *, pool: PoolArena | None) -> EmulatedGraph:
        if self._through_torch_cuda():  # torch.cuda's pool ids, checked by its CUDAGraph
            return self._capture_through_torch_cuda(fn, pool)
        if pool is not None and not isinstance(pool, PoolArena):
            raise TypeError(f"pool must be a handle from graph_pool_handle() or a graph's .pool "
                            f"of the emulated backend, got {type(pool).__name__}")
        arena = pool if pool is not None else self.graph_pool_handle()
        if arena.device != self.device:
            raise ValueError(f"pool lives on {arena.device} but this backend captures on {self.device}")
        session = CaptureSession(arena, self.device, trace=self.trace)
        recorder = session.recorder  # named in this frame: a failed capture's traceback shows it
        session.begin()
        try:
            output = fn()
        except BaseException:
            session.abort()
            raise
        recording = session.end(stacklevel=4)
        return EmulatedGraph(output, arena, recording.steps, recording.inference_mode,
                             recording.external, recording.records)

    def _capture_through_torch_cuda(self, fn: Callable[[], Any], pool: Any) -> CapturedGraph:
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        graph = torch.cuda.CUDAGraph()
        if self.trace:
            graph.keep_trace()
        caller_stream = torch.cuda.current_stream(self.device)
        try:
            with torch.cuda.device(self.device), torch.cuda.graph(graph, pool=pool, stream=self._stream):
                output = fn()
        finally:
            # torch.cuda.graph leaves its side stream current when the capture's end raises.
            torch.cuda.set_stream(caller_stream)
        pool = graph.pool() if pool is None else pool
        return TorchCudaGraph(graph, output, pool) if self.trace else CudaGraph(graph, output, pool)


class TorchCudaGraph(CudaGraph):
    """A traced capture through torch.cuda inside emulate_cuda(): the emulated `CUDAGraph` and its
    recording, read as an `EmulatedGraph` is (`records`, `replay_observed`, `first_use`)."""

    def __init__(self, graph: Any, output: Any, pool: Any) -> None:
        super().__init__(graph, output, pool)
        self.cuda_graph = graph  # the emulated torch.cuda.CUDAGraph (device/graphs.py)

    @property
    def records(self) -> tuple[OpRecord, ...]:
        recording = self.cuda_graph.recording
        return () if recording is None else recording.records

    def replay_observed(self, before: Callable[[OpRecord], Any], after: Callable[[OpRecord], Any]) -> None:
        self.cuda_graph.replay_observed(before, after)

    def first_use(self, address: int) -> str:
        recording = self.cuda_graph.recording
        return "" if recording is None else recording.first_use(address)
