"""The emulated CUDA device's part of `harness bench emulator`: eager on the emulated device
(`harness.emulate_cuda()`, the model and inputs on "cuda") against plain CPU eager, and replay of a
graph captured through `torch.cuda.graph` on it against its own eager. Target (the device issue):
device eager at most 2x CPU eager, replay at most 1.0x device eager.

CPU eager runs outside the emulation and device eager inside it, in alternating rounds, so load
from other processes falls on both alike; each figure is the median over all rounds.
"""

from __future__ import annotations

import statistics
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from harness.bench.timing import wall_samples

EAGER_TARGET = 2.0


@dataclass(frozen=True)
class DeviceTiming:
    case: str
    cpu_ms: float
    device_ms: float
    replay_ms: float

    @property
    def eager_ratio(self) -> float:
        return self.device_ms / self.cpu_ms

    @property
    def replay_ratio(self) -> float:
        return self.replay_ms / self.device_ms



def measure_device(case: str, build: Callable[..., tuple[Callable, Callable]], *, batch: int,
                   iters: int, warmup: int, rounds: int = 5) -> DeviceTiming:
    from harness import emulate_cuda

    per_round = max(1, iters // rounds)
    cpu_step, _ = build(batch)
    with emulate_cuda(device="cpu"):
        device_step, capture_fn = build(batch, device="cuda")
    cpu, device, replay = [], [], []
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with emulate_cuda(device="cpu"):
            device_step()  # warm up before capture, as CUDA needs (the thread's cuBLAS handle)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = capture_fn()
            graph.replay()
            expected = device_step()
            if not torch.equal(static_out, expected):
                raise RuntimeError(f"{case}: replay on the emulated device disagrees with its eager")
        for _ in range(rounds):
            for _ in range(warmup):
                cpu_step()
            cpu += wall_samples(cpu_step, per_round)
            with emulate_cuda(device="cpu"):
                for _ in range(warmup):
                    device_step()
                device += wall_samples(device_step, per_round)
                replay += wall_samples(graph.replay, per_round)
    ms = lambda xs: statistics.median(xs) * 1e3  # noqa: E731
    return DeviceTiming(case, ms(cpu), ms(device), ms(replay))


def render_device(timings: list[DeviceTiming], *, batch: int, iters: int) -> str:
    lines = [f"Eager on the emulated CUDA device vs CPU eager, and replay through torch.cuda.graph on "
             f"it, batch {batch}, bf16, median of {iters} iterations (targets: device/cpu <= "
             f"{EAGER_TARGET:.1f}, replay/device <= 1.0)", "",
             "| case | cpu eager ms | device eager ms | device/cpu | replay ms | replay/device |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {t.case} | {t.cpu_ms:.3f} | {t.device_ms:.3f} | {t.eager_ratio:.2f}x | "
              f"{t.replay_ms:.3f} | {t.replay_ratio:.2f}x |" for t in timings]
    return "\n".join(lines)
