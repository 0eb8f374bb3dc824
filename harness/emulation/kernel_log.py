"""What the emulated device launches while a torch profiler records CUDA activity.

The emulated device runs each device op as torch's CPU kernel, which the profiler records as CPU
ops only. While a profiler with CUDA activity records (profiling.py turns this on and off), the
device's launches are bracketed with profiler ranges named `MARK` and a number, and the number
indexes this log's `Launch`: what was launched (kernels, a copy, a graph), on which stream of
which device. After the profile, profiler_events.py turns each bracket into the device events CUDA
would have recorded (a kernel per op run inside, its time the CPU kernel's) and drops the
brackets.

Off (`DeviceState.kernel_log is None`), the device's hot paths pay one attribute check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from harness import torch_internals

MARK = "harness::emulated_launch#"

# What a bracket holds.
KERNELS = "kernels"  # device ops: each innermost op run inside is one kernel
MEMCPY = "memcpy"  # one copy between host and device, named as CUPTI names it
GRAPH = "graph"  # a graph launch; its nodes are brackets of kind NODE inside
NODE = "node"  # one recorded node of a graph replay: one kernel, whatever runs inside

_RecordFunctionFast = torch_internals.RecordFunctionFast


@dataclass(frozen=True)
class Launch:
    kind: str
    stream: int  # the queue id of the emulated Stream (a wrapper's is its stream's: Stream.queue)
    device: int
    name: str = ""  # MEMCPY: CUPTI's name of the copy ("Memcpy HtoD (Pageable -> Device)")


class KernelLog:
    """The launches of one profiling run (from a profiler's start to its stop)."""

    def __init__(self, state: Any) -> None:
        self._state = state
        self.launches: list[Launch] = []

    def bracket(self, kind: str, name: str = "") -> Any:
        """A context manager bracketing one launch on the current stream."""
        stream = self._state.streams.current()
        device, queue = stream.queue
        self.launches.append(Launch(kind, queue, device, name))
        return _RecordFunctionFast(f"{MARK}{len(self.launches) - 1}")

    def runner(self, runner: Callable | None) -> Callable:
        """The placement mode's call runner with each call bracketed as device ops; `runner`
        itself where nothing launches (a capture records, it does not run)."""
        run = runner or _call
        if self._state.capturing():
            return run

        def bracketed(func, args: tuple, kwargs: dict) -> Any:
            with self.bracket(KERNELS):
                return run(func, args, kwargs)

        return bracketed

    def copy(self, direction: str, pinned: bool, call: Callable[[], Any]) -> Any:
        """`call()`, a copy between host and device ("HtoD", "DtoH", bracketed as CUPTI names
        it); a copy in a capture is not run, and not bracketed."""
        if self._state.capturing():
            return call()
        host = "Pinned" if pinned else "Pageable"
        name = (f"Memcpy HtoD ({host} -> Device)" if direction == "HtoD"
                else f"Memcpy DtoH (Device -> {host})")
        with self.bracket(MEMCPY, name):
            return call()

    def run_graph(self, recording: Any) -> None:
        """A replay's run: the launch bracketed as a graph, each recorded node as one kernel."""
        with self.bracket(GRAPH):
            recording.replay_each(self._node)

    def _node(self, fn, args: tuple, kwargs: dict) -> None:
        with self.bracket(NODE):
            fn(*args, **kwargs)


def _call(func, args: tuple, kwargs: dict) -> Any:
    return func(*args, **kwargs)
