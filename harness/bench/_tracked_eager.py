"""Eager on the emulated CUDA device once stream tracking is on, against CPU eager, for `harness
bench emulator`. Targets (the device issue): race tracking in issue order at most 2x CPU eager,
the adversarial schedule at most 5x.

Any runtime that captures makes a second stream, which turns the tracking on (until then no op can
race and the dispatch mode is not in place): each emulation here makes one before timing. Every
device step ends in `torch.cuda.synchronize()`, as a runtime's step ends reading its tokens to the
host; under the adversarial schedule that is where the queued work runs.

CPU eager runs outside the emulations and each schedule inside its own, in alternating rounds, so
load from other processes falls on all three alike; each figure is the median over all rounds.
"""

from __future__ import annotations

import statistics
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from harness.bench.timing import wall_samples

TRACKED_TARGET = 2.0
ADVERSARIAL_TARGET = 5.0
SCHEDULES = ("issue_order", "adversarial")


@dataclass(frozen=True)
class TrackedEagerTiming:
    case: str
    cpu_ms: float
    tracked_ms: float
    adversarial_ms: float

    @property
    def tracked_ratio(self) -> float:
        return self.tracked_ms / self.cpu_ms

    @property
    def adversarial_ratio(self) -> float:
        return self.adversarial_ms / self.cpu_ms



def _synchronized(step: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    def run() -> torch.Tensor:
        out = step()
        torch.cuda.synchronize()
        return out
    return run


def measure_tracked_eager(case: str, build: Callable[..., tuple[Callable, Callable]], *,
                          batch: int, iters: int, warmup: int, rounds: int = 5
                          ) -> TrackedEagerTiming:
    from harness import emulate_cuda

    per_round = max(1, iters // rounds)
    cpu_step, _ = build(batch)
    device_steps = {}
    for schedule in SCHEDULES:
        with emulate_cuda(device="cpu", schedule=schedule):
            device_steps[schedule] = _synchronized(build(batch, device="cuda")[0])
    samples: dict[str, list[float]] = {"cpu": [], **{s: [] for s in SCHEDULES}}
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = cpu_step()
        for schedule in SCHEDULES:
            with emulate_cuda(device="cpu", schedule=schedule):
                torch.cuda.Stream()  # the first sign of asynchrony: tracking is on from here
                got = device_steps[schedule]()
                if not torch.equal(got.cpu(), expected):
                    raise RuntimeError(f"{case}: eager on the emulated device with schedule="
                                       f"{schedule!r} disagrees with CPU eager")
        for _ in range(rounds):
            for _ in range(warmup):
                cpu_step()
            samples["cpu"] += wall_samples(cpu_step, per_round)
            for schedule in SCHEDULES:
                with emulate_cuda(device="cpu", schedule=schedule):
                    torch.cuda.Stream()
                    step = device_steps[schedule]
                    for _ in range(warmup):
                        step()
                    samples[schedule] += wall_samples(step, per_round)
    ms = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    return TrackedEagerTiming(case, ms["cpu"], ms["issue_order"], ms["adversarial"])


def render_tracked_eager(timings: list[TrackedEagerTiming], *, batch: int, iters: int) -> str:
    lines = [f"Eager on the emulated CUDA device with stream tracking on (a second stream made), "
             f"each step ending in torch.cuda.synchronize(), vs CPU eager, batch {batch}, bf16, "
             f"median of {iters} iterations (targets: tracked/cpu <= {TRACKED_TARGET:.1f}, "
             f"adversarial/cpu <= {ADVERSARIAL_TARGET:.1f})", "",
             "| case | cpu eager ms | tracked ms | tracked/cpu | adversarial ms | adversarial/cpu |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {t.case} | {t.cpu_ms:.3f} | {t.tracked_ms:.3f} | {t.tracked_ratio:.2f}x | "
              f"{t.adversarial_ms:.3f} | {t.adversarial_ratio:.2f}x |" for t in timings]
    return "\n".join(lines)
