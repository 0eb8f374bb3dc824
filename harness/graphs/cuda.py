"""Real CUDA graphs: `torch.cuda.CUDAGraph` captured on a side stream, with torch's errors during
capture re-raised as `CaptureError`. Importing this module needs no CUDA."""

from __future__ import annotations

import gc
import re
from typing import Any, Callable

import torch

from harness.graphs.base import CaptureError, CapturedGraph, GraphBackend, released_graph_error
from harness.graphs.captured_memory import (CapturedMemory, ForeignRead, PoolHolders, PoolStorage,
                                            foreign_freed_error, register_allocations)
from harness.graphs.emulator.callsite import at_callsite, traceback_callsite
from harness.graphs.base import CaptureSyncError
from harness.graphs.emulator.cuda_errors import cuda_first
from harness.graphs.emulator.storage_changes import CapturedTensor, first_changed, storage_changed_error

_ATEN_NAME = re.compile(r"\baten::\w+(?:\.\w+)?")


class CudaGraph(CapturedGraph):
    """`tensors` and `foreign`: what the capture met outside its pool (captured_memory.py), checked
    before each replay; captures through the emulated CUDAGraph check that themselves."""

    def __init__(self, graph: "torch.cuda.CUDAGraph", output: Any, pool: Any, *,
                 tensors: tuple[CapturedTensor, ...] = (), foreign: tuple[ForeignRead, ...] = (),
                 holders: PoolHolders | None = None) -> None:
        self.output = output
        self.pool = pool
        self._graph: "torch.cuda.CUDAGraph | None" = graph
        self._tensors = tensors
        self._foreign = foreign
        self._holders = PoolHolders() if holders is None else holders
        self._holders.hold(pool, self)

    def replay(self) -> None:
        if self._graph is None:
            raise released_graph_error()
        for read in self._foreign:
            if self._holders.freed(read):
                raise foreign_freed_error(read)
        changed = first_changed(self._tensors)
        if changed is not None:
            raise storage_changed_error(changed)
        self._graph.replay()

    def reset(self) -> None:
        if self._graph is not None:
            self._graph.reset()
            self._graph = None
            self._holders.release(self.pool, self)


class CudaBackend(GraphBackend):
    name = "cuda"

    def __init__(self, device: torch.device | str | None = None) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("the cuda graph backend needs CUDA, and torch.cuda.is_available() "
                               "is False; use get_backend('emulated') instead")
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None \
            else torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"the cuda graph backend captures on a cuda device, got {self.device}")
        self._stream: "torch.cuda.Stream | None" = None
        # What this backend's captures allocated, by StorageImpl address (captured_memory.py).
        self._pool_storages: dict[int, PoolStorage] = {}
        self._pool_holders = PoolHolders()

    def graph_pool_handle(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def is_capturing(self) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def _capture(self, fn: Callable[[], Any], *, pool: Any) -> CudaGraph:
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        graph = torch.cuda.CUDAGraph()
        caller_stream = torch.cuda.current_stream(self.device)
        memory = CapturedMemory(pool, self._pool_storages)
        # The collector's automatic runs can fall inside the capture (torch.cuda.graph's own
        # collection before it runs only under torch.compiler.config.force_cudagraph_gc); one could
        # destroy an unreachable CUDAGraph (an engine dropped in a reference cycle), whose reset is
        # an illegal call while a stream captures and invalidates this capture.
        gc_was_enabled = gc.isenabled()
        try:
            with torch.cuda.device(self.device), torch.cuda.graph(graph, pool=pool,
                                                                  stream=self._stream):
                gc.disable()
                with memory:
                    output = fn()
        except Exception as error:
            release_generator_captures(self.device)
            mapped = _as_capture_error(error, memory.failed)
            if mapped is error:
                raise
            raise mapped from error
        finally:
            if gc_was_enabled:
                gc.enable()
            # torch.cuda.graph leaves its side stream current when the capture's end raises.
            torch.cuda.set_stream(caller_stream)
        pool = graph.pool() if pool is None else pool
        register_allocations(self._pool_storages, memory, pool)
        return CudaGraph(graph, output, pool, tensors=memory.tensors.frozen(),
                         foreign=tuple(memory.foreign), holders=self._pool_holders)


def release_generator_captures(device: torch.device) -> None:
    """Undo what a failed capture leaves behind in the device's default RNG.

    torch.cuda.graph marks the default generator as capturing when the capture begins and unmarks it
    only when the capture ends well; after a capture broken by a host sync every later random op on
    the device raises "Offset increment outside graph capture encountered unexpectedly". Replacing the
    generator's state with a fresh one at the same seed and offset makes the device usable again.
    The emulated device's generators behave the same way and take the same remedy.
    """
    generator = torch.cuda.default_generators[device.index if device.index is not None
                                              else torch.cuda.current_device()]
    fresh = torch.Generator(device=device)
    fresh.manual_seed(generator.initial_seed())
    fresh.set_offset(generator.get_offset())
    generator.graphsafe_set_state(fresh)


def _as_capture_error(error: BaseException, failed_op: str | None = None) -> BaseException:
    """The first error of a failed capture, as a CaptureError. When a sync breaks a capture, the
    capture's end raises a second error that hides the first; the first names the cause."""
    chain = []
    cause: BaseException | None = error
    while isinstance(cause, Exception):
        chain.append(cause)
        cause = cause.__context__
    # The earliest error a capture can raise; an unrelated exception the captured code was
    # handling when the sync happened (a KeyError in an except block) sits further back.
    first = next((e for e in reversed(chain) if isinstance(e, RuntimeError)), None)  # AcceleratorError too
    if first is None:
        return error
    if isinstance(first, CaptureError):
        return first
    message = str(first).strip()
    match = _ATEN_NAME.search(message)
    where = traceback_callsite(first.__traceback__)
    headline = message.splitlines()[0] if message else type(first).__name__
    kind = CaptureSyncError if isinstance(first, torch.AcceleratorError) else CaptureError
    # CUDA's own words first (code matches them), then which error and where.
    return kind(cuda_first(headline, at_callsite(
        f"({type(first).__name__} during CUDA graph capture)", where)),
        op=failed_op or (match.group(0) if match else None))
