"""torch.profiler with CUDA activity on the emulated device: what `emulate_cuda()` puts in place of
torch's autograd profiler steps for its duration (`patches(state)`).

Without them, a profiler asked for CUDA activity finds no CUPTI (a CPU build, or a CUDA build
without a GPU) and falls back to timing every op with CUDA events, which the emulated device cannot
record: a warning per op, and no device event. With them:

- a profile asked for CUDA activity records the host with kineto (no CUDA events, no CUPTI);
- while it records, the device brackets its launches (`DeviceState.kernel_log`, kernel_log.py);
- the events it hands out (`events()`, `key_averages()`, `export_chrome_trace`) carry the
  device events made from the brackets (profiler_events.py);
- `torch.autograd.profiler.emit_nvtx` on a build without CUDA does nothing (no NVTX to push
  ranges to, as CUDA without a tool attached).
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.autograd.profiler

from harness import torch_internals
from harness.emulation.kernel_log import KernelLog
from harness.emulation import profiler_events

_FALLBACK = torch_internals.ProfilerState.KINETO_GPU_FALLBACK
_KINETO = torch_internals.ProfilerState.KINETO
_CUDA_ACTIVITY = torch_internals.ProfilerActivity.CUDA


@dataclass
class _Run:
    """One profile on the emulated device: its log, and the plan made of its last results."""

    log: KernelLog | None = None
    plan: Any = None
    results: Any = None  # the kineto results the plan was made of


def patches(state) -> list[tuple[Any, str, Any]]:
    profile = torch.autograd.profiler.profile
    base_init, base_exit = profile.__init__, profile.__exit__
    base_start = torch_internals.autograd_profile_start_trace
    base_parse = torch_internals.autograd_profile_parse_kineto_results
    base_export = profile.export_chrome_trace
    runs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def init(self, *args, **kwargs) -> None:
        base_init(self, *args, **kwargs)
        if getattr(self, "enabled", False) and self.use_device == "cuda":
            # kineto records the host; the device's events come from its brackets
            self.profiler_kind = _KINETO if self.profiler_kind == _FALLBACK else self.profiler_kind
            self.kineto_activities.discard(_CUDA_ACTIVITY)
            runs[self] = _Run()

    def start_trace(self) -> None:
        base_start(self)
        run = runs.get(self)
        if run is not None:
            run.log = state.kernel_log = KernelLog(state)

    def exit_(self, *exc) -> Any:
        try:
            return base_exit(self, *exc)
        finally:
            run = runs.get(self)
            if run is not None and state.kernel_log is run.log:
                state.kernel_log = None

    def planned(self, run: _Run, events: list) -> Any:
        if run.results is not self.kineto_results or run.plan is None:
            first = max((e.id for e in events), default=0) + 1
            run.plan = profiler_events.plan(events, run.log.launches if run.log else [], first)
            run.results = self.kineto_results
        return run.plan

    def parse(self, result, *args, **kwargs) -> list:
        events = base_parse(self, result, *args, **kwargs)
        run = runs.get(self)
        if run is None or run.log is None:
            return events
        return profiler_events.apply_to_events(events, planned(self, run, events), self.use_device)

    def export(self, path, *args, **kwargs) -> Any:
        out = base_export(self, path, *args, **kwargs)
        run = runs.get(self)
        if run is not None and run.log is not None and self.kineto_results is not None \
                and os.path.exists(path):
            events = base_parse(self, self.kineto_results)
            profiler_events.apply_to_trace(path, events, planned(self, run, events))
        return out

    found = [(profile, "__init__", init), (profile, "_start_trace", start_trace),
             (profile, "__exit__", exit_), (profile, "_parse_kineto_results", parse),
             (profile, "export_chrome_trace", export)]
    if not torch.backends.cuda.is_built():
        nvtx = torch.autograd.profiler.emit_nvtx
        found += [(nvtx, "__enter__", _nvtx_enter), (nvtx, "__exit__", _nvtx_exit)]
    return found


# emit_nvtx on a build without CUDA: torch refuses ("compiled without CUDA"); CUDA without a tool
# attached (nsys, ncu) drops the ranges, which is what the emulated device does.
def _nvtx_enter(self) -> Any:
    if not self.enabled:
        return None
    if self.entered:
        raise RuntimeError("NVTX annotation context manager is not reentrant")
    self.entered = True
    torch.cuda.synchronize()
    return self


def _nvtx_exit(self, *exc) -> bool:
    if self.enabled:
        torch.cuda.synchronize()
        self.entered = False
    return False
