"""Decode steps through the whole engine (`Engine.generate`), eager and with decode graphs, with the
overlap loop off and on: what a serving step costs, host work included.

A step's time is the difference of two generations of `batch` requests, one of `NEW_TOKENS` new
tokens and one of 1, divided by the `NEW_TOKENS - 1` decode steps between them, so the prefill and
the per-call work cancel. Each figure is the median of `repeats` such differences.

Each shape runs on the eager-ops path and, with `compiles` including "inductor", on the compiled
path (EngineConfig.compile): its graph engine's `prepare_graphs()` is timed too, the compile of every
piece included (cold when inductor's on-disk cache is empty: give the run a fresh
TORCHINDUCTOR_CACHE_DIR), and its targets are the issue's (tiny <= 0.20 ms, 1b <= 1.0 ms).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from harness.bench._kernel_options import KernelOptions
from harness.bench._report import refuse_fallbacks
from harness.records import Request
from harness.runtime import Engine, EngineConfig

PROMPT = 16
NEW_TOKENS = 48
TARGETS_MS = {"tiny": 0.25, "1b": 1.2}  # per step at batch 1, graphs and overlap, on an H200
COMPILED_TARGETS_MS = {"tiny": 0.20, "1b": 1.0}  # the same, on the compiled path


@dataclass(frozen=True)
class StepTiming:
    model: str
    batch: int
    overlap: bool
    eager_ms: float
    graph_ms: float
    compile: str = "none"
    prepare_s: float = 0.0  # the graph engine's prepare_graphs(), compiles included


def _requests(batch: int, new_tokens: int, vocab: int) -> list[Request]:
    return [Request(prompt=[(7 * i + 3 * r + 1) % vocab for i in range(PROMPT)],
                    max_new_tokens=new_tokens, logprobs=1) for r in range(batch)]


def _engine(model, backend, batch: int, *, graphs: bool, overlap: bool,
            compile: str = "none", options: KernelOptions = KernelOptions(),
            shared: Engine | None = None) -> Engine:
    config = EngineConfig(max_batch_size=batch, max_num_tokens=max(batch * PROMPT, 2 * batch),
                          block_size=16, max_model_len=PROMPT + NEW_TOKENS + 16,
                          decode_graph_sizes=(batch,) if graphs else (),
                          graph_top_k=(1,) if graphs else (), overlap=overlap, compile=compile,
                          **options.config_fields())
    engine = Engine(model, config, backend=backend if graphs else None,
                    compiled_step=shared.compiled_step if shared is not None else None)
    if graphs:
        if engine.device.type == "cuda":
            torch.cuda.synchronize(engine.device)
        start = time.perf_counter()
        engine.prepare_graphs()
        if engine.device.type == "cuda":
            torch.cuda.synchronize(engine.device)
        engine.prepare_seconds = time.perf_counter() - start
    return engine


def ms_per_step(engine: Engine, batch: int, repeats: int) -> float:
    vocab = engine.model.vocab_size
    long, short = _requests(batch, NEW_TOKENS, vocab), _requests(batch, 1, vocab)
    engine.generate(long)  # warm: an engine without graphs compiles its step here
    compiles_before = dict(engine.stats.eager_compiles)
    samples = []
    for _ in range(repeats):
        times = []
        for requests in (long, short):
            if engine.device.type == "cuda":
                torch.cuda.synchronize(engine.device)
            start = time.perf_counter()
            engine.generate(requests)
            times.append(time.perf_counter() - start)
        samples.append((times[0] - times[1]) / (NEW_TOKENS - 1) * 1e3)
    refuse_fallbacks(engine, f"decode steps at batch {batch}", compiles_before)
    return statistics.median(samples)


def time_engine_steps(name: str, model, backend, batches: tuple[int, ...], *,
                      repeats: int, compiles: tuple[str, ...] = ("none",),
                      options: KernelOptions = KernelOptions(),
                      progress: Callable[[str], None] = lambda line: None) -> list[StepTiming]:
    """`progress` hears of each timing as it ends. The compiled engines of one shape (eager and
    graphed apart: a compiled step belongs to one graph backend) share one compiled step."""
    timings = []
    with torch.inference_mode():
        for compile in compiles:
            for batch in batches:
                shared: dict[bool, Engine] = {}
                for overlap in (False, True):
                    eager_engine = _engine(model, backend, batch, graphs=False, overlap=overlap,
                                           compile=compile, options=options,
                                           shared=shared.get(False))
                    eager = ms_per_step(eager_engine, batch, repeats)
                    graph_engine = _engine(model, backend, batch, graphs=True, overlap=overlap,
                                           compile=compile, options=options,
                                           shared=shared.get(True))
                    graph = ms_per_step(graph_engine, batch, repeats)
                    shared.setdefault(False, eager_engine)
                    shared.setdefault(True, graph_engine)
                    timings.append(StepTiming(name, batch, overlap, eager, graph, compile,
                                              graph_engine.prepare_seconds))
                    progress(f"{name} ({compile}): engine step at batch {batch}, overlap "
                             f"{'on' if overlap else 'off'}: eager {eager:.3f} ms, graphs {graph:.3f} ms, "
                             f"prepare {graph_engine.prepare_seconds:.1f} s")
    return timings


def render_steps(timings: list[StepTiming], repeats: int) -> str:
    lines = [f"Decode step through Engine.generate (prompt {PROMPT}, {NEW_TOKENS} new tokens minus 1, "
             f"median of {repeats}; targets with graphs and overlap at batch 1: "
             + ", ".join(f"{k} <= {v:g} ms" for k, v in TARGETS_MS.items()) + "; compiled: "
             + ", ".join(f"{k} <= {v:g} ms" for k, v in COMPILED_TARGETS_MS.items())
             + "). prepare s: the graph engine's prepare_graphs(), compiles included:", "",
             "| model | compile | batch | overlap | eager ms/step | graph ms/step | prepare s |",
             "|---|---|---:|---|---:|---:|---:|"]
    lines += [f"| {t.model} | {t.compile} | {t.batch} | {'on' if t.overlap else 'off'} | {t.eager_ms:.3f} | "
              f"{t.graph_ms:.3f} | {t.prepare_s:.1f} |" for t in timings]
    return "\n".join(lines)


def _target(t: StepTiming) -> float | None:
    return (COMPILED_TARGETS_MS if t.compile == "inductor" else TARGETS_MS).get(t.model)


def step_misses(timings: list[StepTiming]) -> list[str]:
    return [f"{t.model} step ({t.compile}) at batch 1 with overlap {t.graph_ms:.3f} ms > {_target(t):g} ms"
            for t in timings if t.batch == 1 and t.overlap and _target(t) is not None
            and t.graph_ms > _target(t)]
