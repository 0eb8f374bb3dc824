"""CUDA-graph semantics without CUDA: capture records aten ops (recorder.py) into a pool arena
(pool.py); replay re-runs the recording, allocation-free, against the captured storages."""

from __future__ import annotations

from typing import Any, Callable

import torch

from harness.torch_internals import get_current_dispatch_mode_stack
from harness.graphs.base import GraphBackend
from harness.graphs.cuda import CudaGraph, release_generator_captures
from harness.graphs.emulator.graph import EmulatedGraph
from harness.graphs.emulator.pool import PoolArena
from harness.graphs.emulator.recorder import Recorder
from harness.graphs.emulator.capture_session import CaptureSession
from harness.graphs.emulator.trace import OpRecord


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
        return any(isinstance(mode, Recorder) for mode in get_current_dispatch_mode_stack())

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
                             recording.external, recording.records, tensors=recording.tensors,
                             allocated=recording.allocated, shared=recording.shared)

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
        except Exception:
            # As on CUDA, a capture that failed may leave the default generator capturing.
            release_generator_captures(self.device)
            raise
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
