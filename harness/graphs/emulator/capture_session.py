"""One emulated capture from its beginning to its end, in two calls: what `EmulatedBackend.capture`
runs around a callable, and what the emulated `torch.cuda.CUDAGraph` runs between `capture_begin()`
and `capture_end()`, where the captured code runs in between in the caller's own frames."""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from harness.graphs.emulator.capture_flag import reports_capturing
from harness.graphs.emulator.cuda_paths import CudaPaths
from harness.graphs.emulator.external import ExternalStorage
from harness.graphs.emulator.host_guard import host_reads_raise
from harness.graphs.emulator.host_tensors import HostTensors
from harness.graphs.emulator.dispatch_keys import keep_modes_reachable
from harness.graphs.emulator.memory import for_device
from harness.graphs.emulator.opinfo import ReplayStep
from harness.graphs.emulator.pool import PoolArena
from harness.graphs.emulator.recorder import CompiledCodeRecorder, Recorder
from harness.graphs.emulator.rng import rng_recorded

EMPTY_GRAPH_WARNING = ("The CUDA Graph is empty. This usually means that the graph was attempted "
                       "to be captured on wrong device or stream.")


@dataclass(frozen=True)
class Recording:
    """What a finished capture hands to the graph that replays it."""

    steps: list[ReplayStep]
    inference_mode: bool
    external: list[ExternalStorage]
    records: list  # trace.OpRecord per op when traced
    reads: frozenset[int] = frozenset()  # storages (data pointers) a replay reads and writes
    writes: frozenset[int] = frozenset()
    tensors: tuple = ()  # storage_changes.CapturedTensor per tensor object met outside the pool
    allocated: tuple = ()  # pool.Block per block the capture allocated
    shared: tuple = ()  # shared_blocks.SharedBlock per block of another capture into the pool
    segments: tuple = ()  # (reads, writes, event recorded after them): recorder.replay_segments


class CaptureSession:
    """`begin()` enters the recorder and the guards a capture needs; `end()` leaves them and returns
    the `Recording`; `abort()` leaves them after a failure and drops what was recorded.

    `memory` says which tensors are device memory (emulator/memory.py; by default what the plain
    emulator assumes on `device`); `kernel_device` whose kernels' rules apply; `report_capturing`
    makes `torch.cuda.is_current_stream_capturing()` answer True meanwhile (the emulated CUDA device
    answers it itself, by stream); `trace` keeps an OpRecord per op (the recorder's); `rng_device`
whose generator the capture's RNG state calls record (emulator/rng.py; by default `device`'s: the
emulated CUDA device keeps its memory on the cpu but draws from its own generators);
`compiled_code_runs`: a compiled call inside the capture runs its compiled code into it, as on
CUDA (recorder.CompiledCodeRecorder; the emulated CUDA device, which takes CUDA's one_hot itself)."""

    def __init__(self, arena: PoolArena, device: torch.device, *, memory: Any = None,
                 kernel_device: torch.device | None = None, report_capturing: bool = True,
                 trace: bool = False, rng_device: torch.device | None = None,
                 compiled_code_runs: bool = False) -> None:
        self.memory = memory if memory is not None else for_device(device)
        recorder = CompiledCodeRecorder if compiled_code_runs else Recorder
        self.recorder = recorder(arena, device, self.memory, kernel_device, trace=trace)
        # The torch function modes stay as they are (CUDA's one_hot is the device's own), so the
        # guards of code compiled before the capture still hold inside it.
        self._cuda_paths = device.type == "cpu" and not compiled_code_runs
        self._device = device
        self._rng_device = rng_device if rng_device is not None else device
        self._report_capturing = report_capturing
        self._stack: contextlib.ExitStack | None = None
        # Set by a device that knows streams and threads: whether a host read is outside the
        # capture (host_guard.host_reads_raise's `outside`).
        self.reads_outside: Any = None

    @property
    def active(self) -> bool:
        return self._stack is not None

    def begin(self) -> None:
        device, recorder = self._device, self.recorder
        stack = contextlib.ExitStack()
        try:
            on_device = None if self.memory.all_device else self.memory.is_device
            stack.enter_context(host_reads_raise(device, on_device, recorder.refuse_sync,
                                                 self.reads_outside))
            if self._report_capturing:
                stack.enter_context(reports_capturing())
            stack.enter_context(rng_recorded(self._rng_device, recorder.steps))
            if self._cuda_paths:
                stack.enter_context(CudaPaths())
            if device.type == "cpu" and self.memory.all_device:
                # Only the plain emulator guesses host tensors; the emulated CUDA device knows.
                stack.enter_context(HostTensors())
            stack.enter_context(recorder)
            keep_modes_reachable()
        except BaseException:
            stack.close()
            raise
        self._stack = stack

    def end(self, *, warn_if_empty: bool = True, stacklevel: int = 3) -> Recording:
        """Leave the capture; errors of the guards' exits (the RNG state check) abort it."""
        stack, self._stack = self._stack, None
        if stack is None:
            raise RuntimeError("CaptureSession.end() without a capture in progress")
        try:
            stack.close()
            unjoined = self.recorder.collectives.unjoined_error()
            if unjoined is not None:
                raise unjoined
        except BaseException:
            self.recorder.discard()
            raise
        steps = self.recorder.steps
        if warn_if_empty and not steps:
            # torch.cuda.graph's own words and category (CUDAGraph::capture_end, a TORCH_WARN).
            warnings.warn(EMPTY_GRAPH_WARNING, UserWarning, stacklevel=stacklevel)
        return Recording(steps, torch.is_inference_mode_enabled(), self.recorder.external.storages(),
                         self.recorder.records,
                         frozenset(self.recorder.reads - self.recorder.writes),
                         frozenset(self.recorder.writes), self.recorder.external.tensors.frozen(),
                         tuple(self.recorder.allocated_blocks),
                         tuple(self.recorder.shared_blocks.values()),
                         self.recorder.replay_segments())

    def abort(self) -> None:
        """Leave a failed capture. The traceback keeps the caller's frame (and the recorder) alive
        in a reference cycle; the recording's non-owning aliases are dropped now, in order, instead
        of at some later garbage collection."""
        stack, self._stack = self._stack, None
        try:
            if stack is not None:
                stack.close()
        finally:
            self.recorder.discard()
