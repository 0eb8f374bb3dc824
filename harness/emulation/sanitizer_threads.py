"""The graph sanitizer's stream rules for work outside its recorder's own thread and streams.

The sanitizer (`emulate_cuda()` on a GPU) emulates its captures over the real GPU: no driver
capture runs, so CUDA itself neither captures another thread's launch nor refuses a host read or
a legacy-stream launch that a real capture would refuse. `SanitizerStreamRules`, a dispatch mode,
applies CUDA's rules instead, as the emulated device does (capture_threads.py,
tracking/capture_streams.py, capture_syncs.py):

- another thread's op on a stream taking part in the capture runs through the capture's modes
  (its recorder): captured, not run, and replayed with the graph, in every capture_error_mode;
- an op that makes the host wait for device data (`.item()`, a blocking copy to the host, a
  data-dependent shape) on a stream outside the capture is Copy.cu's copy followed by a sync of
  that stream: refused by the capture's mode as a potentially unsafe call
  (`capture_syncs.read_outside_capture`), else run at once, outside the graph;
- other device work on a stream outside the capture (the legacy default stream included, which
  CUDA does not refuse: tracking/capture_streams.py) runs at once, outside the graph, from any
  thread (the recorder below the mode does not see it).

One instance is pushed above the recorder for each capture (on the capturing thread, where it
joins the capture's thread modes), and each thread started inside the sanitizer runs under one
for its whole life (`thread_start_patch`).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from harness import torch_internals
from harness.torch_internals import TorchDispatchMode, disable_current_modes, tree_flatten
from harness.graphs.emulator import opinfo
from harness.emulation.capture_syncs import read_outside_capture
from harness.emulation.capture_threads import capture_modes_for_this_thread, joined
from harness.emulation.tracking.real_streams import host_waits
from harness.graphs.emulator.tensor_subclasses import defer_to_subclass

__harness_machinery__ = True  # its frames are not the program's callers (callsite.py)


def _on_the_gpu(func, args: tuple, kwargs: dict) -> bool:
    """Whether the op is device work: a CUDA tensor among its arguments, or a CUDA result."""
    for value in tree_flatten((args, kwargs))[0]:
        if isinstance(value, torch.Tensor) and value.device.type == "cuda":
            return True
    device = kwargs.get("device")
    return device is not None and torch.device(device).type == "cuda"


class SanitizerStreamRules(TorchDispatchMode):
    """See the module docstring; `host` is the sanitizer's SanitizerHost."""

    supports_higher_order_operators = True

    def __init__(self, host: Any) -> None:
        super().__init__()
        self.host = host

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if types and defer_to_subclass(types):
            return NotImplemented  # the subclass's own dispatch first (tensor_subclasses.py)
        kwargs = kwargs or {}
        host = self.host
        graph = host.capture
        if graph is None:
            return func(*args, **kwargs)
        stream = host.current_stream()
        if host.stream_captures(stream):
            modes = capture_modes_for_this_thread(host)
            if modes:  # another thread's op on a capturing stream: the recorder's
                with joined(modes):
                    out = func(*args, **kwargs)
            else:
                out = func(*args, **kwargs)
            if _on_the_gpu(func, args, kwargs):
                # A node of its branch of the graph: a fork's must be joined back
                # (capture_forks.py), and it is judged for races (sanitizer_races.py).
                forks, races = host.capture_forks, host.capture_races
                if forks is not None:
                    forks.ran(stream, forks.launch(stream))
                if races is not None:
                    races.op(stream, func, args, kwargs, out)
            return out
        if not _on_the_gpu(func, args, kwargs):
            return func(*args, **kwargs)  # host work
        if not isinstance(func, torch_internals.HigherOrderOperator) and (
                host_waits(func, args, kwargs) or opinfo.sync_reason(func, args, kwargs)):
            read_outside_capture(host, opinfo.op_name(func))
            with disable_current_modes():
                return func(*args, **kwargs)
        # Other device work on a stream outside the capture runs now and stays out of the graph,
        # as CUDA runs it; below this mode the capturing thread's recorder would replay it.
        with disable_current_modes():
            return func(*args, **kwargs)


def thread_start_patch(host: Any, active: Any) -> list[tuple[Any, str, Any]]:
    """The replacement of `threading.Thread.start` inside the sanitizer: each new thread runs
    under a `SanitizerStreamRules` of `host` while `active()` (the sanitizer is still in force)."""
    start = threading.Thread.start

    def start_under_the_rules(self: threading.Thread) -> None:
        run = self.run

        def run_under_the_rules() -> None:
            if not active():
                run()
                return
            with SanitizerStreamRules(host):
                run()

        self.run = run_under_the_rules
        start(self)

    return [(threading.Thread, "start", start_under_the_rules)]
