"""Median wall time of functions that take turns, for `harness bench` (never for a test)."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def median_ms(*fns: Callable[[], object], iters: int, warmup: int,
              device: torch.device | None = None) -> list[float]:
    """Median milliseconds of each function. They take turns within every iteration, so load from
    other processes on a shared machine falls on all of them alike; on a cuda `device` each call is
    timed to the device's completion."""
    def sync() -> None:
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        for fn in fns:
            fn()
    sync()
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(iters):
        for fn, times in zip(fns, samples):
            start = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - start)
    return [statistics.median(times) * 1e3 for times in samples]


def wall_samples(fn: Callable[[], object], count: int) -> list[float]:
    """Seconds of each of `count` calls of `fn`, host wall time (the caller syncs inside `fn`)."""
    out = []
    for _ in range(count):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out
