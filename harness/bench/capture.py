"""`harness bench capture`: decode-graph capture and replay through the engine.

Two measurements per model shape (the tiny CPU-suite model and the Llama-3.2-1B shape):

- capture: the final phase's `warmup_and_capture` with one pass against two passes, graphs of batch
  1, 8 and 64, each on a fresh engine after one untimed capture warmed the kernels up; the median of
  `CAPTURE_REPEATS` captures per arm, the arms alternating. Target
  (docs/design.md, "Performance targets"): single/two <= 0.7 (the floor is about 0.67 when a capture costs one eager forward).
- replay: one decode step of batch 1, 8 and 64 through the engine's graph path (prepare, pad,
  replay) against its eager path (prepare, forward). Targets on an H200: eager/replay >= 15x for
  the tiny model and >= 6x for the 1B shape at batch 1; the 1B shape's replay time is printed
  against the floor of reading its weights once at HBM bandwidth (4.8 TB/s on an H200).

Each replay ratio comes from one run: the median of many timed iterations after warmup.

`--compile` (default both): each measurement on the eager-ops path and on the compiled path
(EngineConfig.compile="inductor": inductor pieces between the attention ops, the decode graphs over
them); the first capture of each shape is timed apart, every compile in it.

Then, in the same run: the decode step through `Engine.generate`, eager and with graphs, overlap off
and on (_engine_steps.py; targets at batch 1 with graphs and overlap: tiny <= 0.25 ms, 1b <= 1.2 ms
on an H200), the ops per layer of a decode step as a CPU proxy for kernels (_kernels.py), and on cuda
the kernels one replay of batch 1 launches (torch.profiler, counted after every timing: CUPTI stays
attached once the profiler has run, and slows every host loop after it).

`--profile` (one model, one `--batch`, one `--compile` path: `both` profiles the eager ops, one
`--pdl` setting, the sizes of `--capture-sizes` captured): the engine's graph step (prepare,
replay, ranking and its device-to-host transfer) under torch.profiler, the top host-side costs, and
a perf_counter breakdown of the step with the share that is graph replay against host work; on cuda
also one replay's device side: kernels by device time, and the replay's span against the time a
kernel was running (the rest is the device idle between kernels). Prints only; writes nothing.

`--decode-kernel` (default auto): what attends decode batches in every engine of the run
(EngineConfig.decode_kernel): `torch` against `triton` is the before and after of the paged-decode
kernel; the run prints which one served and why. `--rope-kv-write` (default auto) does the same
for EngineConfig.rope_kv_write: `separate` against `fused` is the before and after of
`harness::rope_kv_write`; `--decode-linear` (default auto) for EngineConfig.decode_linear:
`separate` against `fused` is the before and after of the decode GEMV ops (norm + qkv, o_proj +
residual, norm + gate_up + SiLU-and-multiply, down + residual); `--greedy-ranking` (default auto)
for EngineConfig.greedy_ranking: `separate` against `fused` is the before and after of
`harness::greedy_pack` in the engine step's top-1 graphs. `--pdl` (default auto) for
EngineConfig.pdl: `both` runs every measurement with PDL off, then on, and prints (and appends)
one set of tables per setting, headed "PDL off" / "PDL on"; `on` where PDL cannot run exits 2 with
the reason, before anything is built.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

from harness.bench._report import add_output_options, append_section, machine_line
from harness.bench._kernel_options import KernelOptions
from harness.bench._engine_steps import render_steps, step_misses, time_engine_steps
from harness.bench._kernels import (cuda_kernels_per_replay, op_counts, render_device_profile,
                                    render_op_counts, replay_device_profile)
from harness.bench.timing import median_ms
from harness.records import BACKENDS
from harness.cli_support import require_backend
from harness.graphs import get_backend
from harness.model import ReferenceLlama, llama_1b_config, random_llama, tiny_llama_config
from harness.ops.decode_kernel import choose_decode_kernel
from harness.ops.decode_linear_choice import choose_decode_linear
from harness.ops.greedy_ranking_choice import choose_greedy_ranking
from harness.ops.pdl_choice import PdlChoice, choose_pdl
from harness.ops.rope_kv_choice import choose_rope_kv_write
from harness.ops.metadata import SequenceSpan
from harness.runtime import Engine, EngineConfig
from harness.runtime.decode.runner import pad_decode_batch
from harness.ranking import logits_to_steps

BATCHES = (1, 8, 64)
CAPTURE_TARGET = 0.7
COMPILED_CAPTURE_TARGET = 0.65  # the single/two target, on the compiled path
REPLAY_TARGETS = {"tiny": 15.0, "1b": 6.0}  # eager/replay at batch 1
HBM_BYTES_PER_S = 4.8e12  # H200
CONTEXT = 64  # tokens of context per sequence in the timed decode steps
CONFIGS = {"tiny": tiny_llama_config, "1b": llama_1b_config}


@dataclass(frozen=True)
class CaptureTiming:
    model: str
    two_pass_ms: float
    single_pass_ms: float
    compile: str = "none"
    first_capture_s: float = 0.0  # the first engine's untimed capture: every compile, cold or cached
    compile_s: tuple[tuple[int, float], ...] = ()  # (batch size, seconds of its compile) in it
    batches: tuple[int, ...] = BATCHES

    @property
    def ratio(self) -> float:
        return self.single_pass_ms / self.two_pass_ms


@dataclass(frozen=True)
class ReplayTiming:
    model: str
    batch: int
    eager_ms: float
    replay_ms: float

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.replay_ms


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model(name: str, device: torch.device) -> ReferenceLlama:
    return ReferenceLlama.from_hf(random_llama(CONFIGS[name](), seed=0)).to(device)


def progress(line: str) -> None:
    """One line on stderr as each step of a long run ends (the 1B shape compiles for minutes)."""
    print(f"[bench capture] {line}", file=sys.stderr, flush=True)


def engine_config(*, single_pass: bool, compile: str = "none", batches: tuple[int, ...] = BATCHES,
                  options: KernelOptions = KernelOptions()) -> EngineConfig:
    return EngineConfig(max_batch_size=max(batches), max_num_tokens=max(batches) * 2, block_size=16,
                        max_model_len=2 * CONTEXT, decode_graph_sizes=batches,
                        single_pass_capture=single_pass, compile=compile, **options.config_fields())


def _new_engine(model: ReferenceLlama, backend, *, single_pass: bool, compile: str = "none",
                batches: tuple[int, ...] = BATCHES, shared: Engine | None = None,
                options: KernelOptions = KernelOptions()) -> Engine:
    # The compiled path compiles every size in this untimed first capture: a capture is timed
    # against what it records, not against inductor. Engines after the first share its compiled
    # step (`shared`), so each size is compiled once per run, not once per engine.
    step = shared.compiled_step if shared is not None else None
    engine = Engine(model, engine_config(single_pass=single_pass, compile=compile, batches=batches,
                                         options=options),
                    backend=backend, compiled_step=step)
    _sync(model.device)
    start = time.perf_counter()
    engine.decode_graphs.warmup_and_capture("estimate")  # first-use work, untimed
    _sync(model.device)
    engine.first_capture_s = time.perf_counter() - start
    engine.decode_graphs.release()
    return engine


CAPTURE_REPEATS = 5  # timed captures per arm, alternating; one capture is a few ms on the tiny shape


def compile_seconds(engine: Engine) -> dict[int, float]:
    """Seconds of the compiled step's compile per decode batch size (dynamo and inductor)."""
    step = engine.compiled_step
    return {} if step is None else {key[1]: s for key, s in step.compile_seconds.items()}


def time_capture(name: str, model: ReferenceLlama, backend, *,
                 repeats: int = CAPTURE_REPEATS, compile: str = "none",
                 batches: tuple[int, ...] = BATCHES,
                 options: KernelOptions = KernelOptions()) -> CaptureTiming:
    """The median of `repeats` timed captures per arm, the arms alternating so that drift in the
    machine's speed reaches both, after one untimed capture of each."""
    device = model.device
    times: dict[bool, list[float]] = {False: [], True: []}
    first: Engine | None = None
    for run in range(repeats + 1):
        this_run: dict[bool, float] = {}
        for single_pass in (False, True):
            # The previous arm's engine is unreachable here, but held in reference cycles: left to
            # the collector's own schedule, its graphs and memory would be freed in whichever
            # timed capture a collection of the oldest generation happens to fall into.
            engine = None
            gc.collect()
            engine = _new_engine(model, backend, single_pass=single_pass, compile=compile,
                                 batches=batches, shared=first, options=options)
            if first is None:
                first = engine
                progress(f"{name} ({compile}): first capture of batch {', '.join(map(str, batches))} "
                         f"{engine.first_capture_s:.1f} s" + "".join(
                             f"; compile of batch {b} {s:.1f} s" for b, s in compile_seconds(engine).items()))
            _sync(device)
            start = time.perf_counter()
            engine.decode_graphs.warmup_and_capture("serve")
            _sync(device)
            this_run[single_pass] = (time.perf_counter() - start) * 1e3
            if run:
                times[single_pass].append(this_run[single_pass])
            report = engine.capture_reports[-1]
            if report.passes != (1 if single_pass else 2):
                raise RuntimeError(f"{name}: expected {1 if single_pass else 2} capture passes, the "
                                   f"report says {report}")
        # Each run's own times, so that a median off its usual ratio can be traced to one arm.
        progress(f"{name} ({compile}): capture run {run} of {repeats} done"
                 + (" (untimed)" if not run else "")
                 + f": two passes {this_run[False]:.1f} ms, single pass {this_run[True]:.1f} ms")
    return CaptureTiming(name, two_pass_ms=statistics.median(times[False]),
                         single_pass_ms=statistics.median(times[True]), compile=compile,
                         first_capture_s=first.first_capture_s,
                         compile_s=tuple(compile_seconds(first).items()), batches=batches)


def time_replay(name: str, model: ReferenceLlama, backend, *, iters: int, warmup: int,
                batches: tuple[int, ...] = BATCHES,
                options: KernelOptions = KernelOptions()) -> list[ReplayTiming]:
    """Eager against replay at every batch."""
    engine = _new_engine(model, backend, single_pass=False, batches=batches, options=options)
    engine.decode_graphs.warmup_and_capture("serve")
    device = model.device
    cache = engine.kv_cache
    timings = []
    for batch in batches:
        spans, ids, blocks = _decode_spans(engine, batch)

        def eager() -> torch.Tensor:
            engine.prepare_padded(spans, input_ids=ids)
            return engine.model(engine.input_ids, engine.metadata, engine.kv_cache)

        def replay() -> torch.Tensor:
            step = engine.decode_graphs.run(spans, ids)
            if step is None:
                raise RuntimeError(f"no decode graph for batch {batch}")
            return step.logits

        expected, got = eager().clone(), replay()
        if not torch.allclose(expected, got, atol=0.5, rtol=0.05):
            raise RuntimeError(f"{name} batch {batch}: replay disagrees with eager by up to "
                               f"{(expected - got).abs().max().item()}")
        eager_ms, replay_ms = median_ms(eager, replay, iters=iters, warmup=warmup, device=device)
        timings.append(ReplayTiming(name, batch, eager_ms, replay_ms))
        for b in blocks:
            cache.allocator.free(b)
        progress(f"{name}: replay of batch {batch} timed")
    return timings


def count_replay_kernels(model: ReferenceLlama, backend, *,
                         options: KernelOptions = KernelOptions()) -> float:
    """CUDA kernels one decode replay of batch 1 launches (torch.profiler). Run it after every
    timing of the process: once the profiler has attached CUPTI it stays attached, and on an H200
    the tiny step's host loop ran about 25% slower for the rest of the process (0.11 -> 0.135 ms
    a step, a device-to-device copy_ 6.1 -> 8.0 us)."""
    engine = _new_engine(model, backend, single_pass=False, batches=(1,), options=options)
    engine.decode_graphs.warmup_and_capture("serve")
    spans, ids, blocks = _decode_spans(engine, 1)

    def replay() -> None:
        if engine.decode_graphs.run(spans, ids) is None:
            raise RuntimeError("no decode graph for batch 1")

    try:
        return cuda_kernels_per_replay(replay)
    finally:
        for b in blocks:
            engine.kv_cache.allocator.free(b)


@dataclass(frozen=True)
class StepBreakdown:
    """Median milliseconds of each part of one graph decode step. `replay_ms` is synchronized, so on
    cuda it is the graph's device time; the rest is host work."""

    model: str
    batch: int
    prepare_ms: float
    replay_ms: float
    rank_ms: float
    step_ms: float  # the whole step as the engine runs it: run() then the ranking

    @property
    def host_ms(self) -> float:
        return max(self.step_ms - self.replay_ms, 0.0)

    @property
    def replay_share(self) -> float:
        return self.replay_ms / self.step_ms if self.step_ms else 0.0


def _decode_spans(engine: Engine, batch: int) -> tuple[tuple[SequenceSpan, ...], tuple[int, ...], list]:
    cache = engine.kv_cache
    blocks = [cache.allocator.allocate(-(-CONTEXT // cache.block_size)) for _ in range(batch)]
    spans = tuple(SequenceSpan(seq_len=CONTEXT, query_len=1, block_table=tuple(b)) for b in blocks)
    return spans, tuple(range(1, batch + 1)), blocks


def profile_step(name: str, model: ReferenceLlama, backend, batch: int, *, iters: int,
                 warmup: int, compile: str = "none", batches: tuple[int, ...] = BATCHES,
                 options: KernelOptions = KernelOptions()) -> tuple[str, StepBreakdown, str | None]:
    """The top host-side costs of the engine's graph step under torch.profiler, its breakdown, and
    on cuda where one replay's device time goes (None elsewhere)."""
    if batch not in batches:
        raise ValueError(f"--batch {batch} is not among the captured sizes {batches}")
    engine = _new_engine(model, backend, single_pass=False, compile=compile, batches=batches,
                         options=options)
    graphs = engine.decode_graphs
    graphs.warmup_and_capture("serve")
    device = model.device
    spans, ids, _ = _decode_spans(engine, batch)
    logprobs = [1] * batch
    key = graphs.graph_key(graphs.size_for(batch), None)
    parts: dict[str, Callable[[], object]] = {}

    def step() -> object:  # what Engine._forward and its ForwardResult.steps do for a decode batch
        result = graphs.run(spans, ids, logprobs)
        return logits_to_steps(result.logits, logprobs, str(result.key))

    def prepare() -> None:
        graphs._prepare(pad_decode_batch(spans, key.batch_size), ids)

    def replay() -> None:
        parts["logits"] = graphs.runner.replay(key)[:batch]

    def rank() -> object:
        return logits_to_steps(parts["logits"], logprobs, str(key))

    prepare_ms, replay_ms, rank_ms, step_ms = median_ms(prepare, replay, rank, step, device=device,
                                                        iters=iters, warmup=warmup)
    breakdown = StepBreakdown(name, batch, prepare_ms, replay_ms, rank_ms, step_ms)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(iters):
            with torch.profiler.record_function("step: prepare"):
                prepare()
            with torch.profiler.record_function("step: replay"):
                replay()
            with torch.profiler.record_function("step: rank + transfer"):
                rank()
        _sync(device)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    device_table = None
    if device.type == "cuda":
        device_table = render_device_profile(replay_device_profile(
            lambda: graphs.runner.replay(key), iters=iters))
    return table, breakdown, device_table


def render_profile(table: str, b: StepBreakdown, backend_name: str, iters: int) -> str:
    lines = [f"Graph decode step of {b.model} at batch {b.batch}, backend {backend_name}, "
             f"{iters} iterations.", "", "Top host-side costs (torch.profiler, by self CPU time):", table,
             "Breakdown (time.perf_counter, median ms; replay synchronized):", "",
             "| part | ms |", "|---|---:|",
             f"| prepare (metadata + input ids) | {b.prepare_ms:.3f} |",
             f"| replay | {b.replay_ms:.3f} |",
             f"| ranking + device-to-host transfer | {b.rank_ms:.3f} |",
             f"| whole step (run + ranking) | {b.step_ms:.3f} |", "",
             f"graph replay {b.replay_ms:.3f} ms = {b.replay_share:.0%} of the step; host work "
             f"{b.host_ms:.3f} ms = {1 - b.replay_share:.0%}"]
    return "\n".join(lines)


def weight_floor_ms(model: ReferenceLlama) -> float:
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return weights / HBM_BYTES_PER_S * 1e3


def render(backend_name: str, captures: list[CaptureTiming], replays: list[ReplayTiming],
           floors: dict[str, float], iters: int, *, batches: tuple[int, ...] = BATCHES,
           repeats: int = CAPTURE_REPEATS) -> str:
    lines = [f"Decode graphs through the engine, backend {backend_name}, bf16, graphs of batch "
             f"{', '.join(map(str, batches))}, context {CONTEXT} tokens, median of {iters} iterations.", "",
             f"Capture of the final phase, median of {repeats} per arm (target single/two <= "
             f"{CAPTURE_TARGET}, compiled <= {COMPILED_CAPTURE_TARGET}):", "",
             "| model | compile | two passes ms | single pass ms | single/two | first capture s | "
             "compile s per batch |",
             "|---|---|---:|---:|---:|---:|---|"]
    lines += [f"| {c.model} | {c.compile} | {c.two_pass_ms:.1f} | {c.single_pass_ms:.1f} | {c.ratio:.2f}x | "
              f"{c.first_capture_s:.1f} | {', '.join(f'{b}: {s:.1f}' for b, s in c.compile_s) or '-'} |"
              for c in captures]
    lines += ["", "first capture s: the first engine's first capture of batch "
              f"{', '.join(map(str, batches))}, untimed in the ratio; on the compiled path every "
              "inductor compile of the shape is in it (cold with an empty TORCHINDUCTOR_CACHE_DIR: "
              "the cold compile time), and compile s per batch splits it by batch size. Every later "
              "engine of the shape shares the first one's compiled step."]
    lines += ["", "Decode step, eager against graph replay (targets at batch 1: "
              + ", ".join(f"{k} >= {v:g}x" for k, v in REPLAY_TARGETS.items()) + "):", "",
              "| model | batch | eager ms | replay ms | eager/replay | weights at HBM bandwidth ms |",
              "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r.model} | {r.batch} | {r.eager_ms:.3f} | {r.replay_ms:.3f} | {r.speedup:.1f}x | "
              f"{floors[r.model]:.3f} |" for r in replays]
    return "\n".join(lines)


def misses(captures: list[CaptureTiming], replays: list[ReplayTiming]) -> list[str]:
    missed = []
    for c in captures:
        target = COMPILED_CAPTURE_TARGET if c.compile == "inductor" else CAPTURE_TARGET
        if c.ratio > target:
            missed.append(f"{c.model} capture ({c.compile}) {c.ratio:.2f}x > {target}")
    missed += [f"{r.model} replay at batch 1 {r.speedup:.1f}x < {REPLAY_TARGETS[r.model]:g}x"
               for r in replays if r.batch == 1 and r.speedup < REPLAY_TARGETS[r.model]]
    return missed


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        sizes = ()
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"expected batch sizes >= 1 separated by commas, e.g. 1,8; "
                                         f"got {text!r}")
    return sizes


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="harness bench capture", description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(CONFIGS), action="append",
                        help="model shape (repeatable; default tiny and 1b on cuda, tiny on cpu)")
    parser.add_argument("--backend", default="auto", choices=BACKENDS)
    parser.add_argument("--iters", type=int, default=100, help="timed iterations (default 100)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed iterations first (default 10)")
    add_output_options(parser)
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--profile", action="store_true",
                        help="profile the graph step of one --model at one --batch; prints only")
    parser.add_argument("--batch", type=int, default=1, choices=BATCHES, help="--profile's batch (default 1)")
    parser.add_argument("--compile", choices=("none", "inductor", "both"), default="both",
                        help="the engine paths timed (EngineConfig.compile): the eager ops, the "
                             "compiled path, or both (default)")
    parser.add_argument("--decode-kernel", choices=("auto", "torch", "triton"), default="auto",
                        help="what attends decode batches (EngineConfig.decode_kernel): auto (triton "
                             "on CUDA where it imports, default), the torch gather path, or triton")
    parser.add_argument("--rope-kv-write", choices=("auto", "separate", "fused"), default="auto",
                        help="how layers rotate q/k and store K/V (EngineConfig.rope_kv_write): auto "
                             "(fused on CUDA where triton imports, default), separate (rope in torch "
                             "ops, the write inside attention), or fused (harness::rope_kv_write)")
    parser.add_argument("--decode-linear", choices=("auto", "separate", "fused"), default="auto",
                        help="how decode-sized batches run the linear layers (EngineConfig."
                             "decode_linear): auto (fused on CUDA where triton imports, default), "
                             "separate (torch ops), or fused (the decode GEMV ops)")
    parser.add_argument("--greedy-ranking", choices=("auto", "separate", "fused"), default="auto",
                        help="how a top-1 graph ranks its logits (EngineConfig.greedy_ranking): auto "
                             "(fused on CUDA where triton imports, default), separate (torch ops), "
                             "or fused (harness::greedy_pack)")
    parser.add_argument("--pdl", choices=("auto", "off", "on", "both"), default="auto",
                        help="Programmatic Dependent Launch of the Triton kernels (EngineConfig.pdl): "
                             "auto (on where it can run, default), off, on (refused where it cannot "
                             "run), or both: every measurement twice, PDL off then on, each set of "
                             "tables headed by its setting")
    parser.add_argument("--capture-sizes", type=_sizes, default=BATCHES, metavar="N[,N...]",
                        help="decode batch sizes captured, compiled and timed (default "
                             f"{','.join(map(str, BATCHES))}); e.g. 1, so the 1B shape on the "
                             "compiled path fits one short run")
    parser.add_argument("--capture-repeats", type=int, default=CAPTURE_REPEATS,
                        help=f"timed captures per arm (default {CAPTURE_REPEATS})")
    parser.add_argument("--step-repeats", type=int, default=5,
                        help="repeats of the engine-step timing, eager and graphs, overlap off and on "
                             "(default 5; 0 skips it)")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or args.step_repeats < 0 or args.capture_repeats < 1:
        parser.error(f"--iters and --capture-repeats must be at least 1, --warmup and --step-repeats "
                     f"at least 0, got {args.iters}, {args.capture_repeats}, {args.warmup}, "
                     f"{args.step_repeats}")
    if args.profile and args.model and len(args.model) > 1:
        parser.error(f"--profile takes one --model, got {args.model}")
    if args.profile and args.batch not in args.capture_sizes:
        parser.error(f"--batch {args.batch} is not among --capture-sizes "
                     f"{','.join(map(str, args.capture_sizes))}")
    require_backend("--backend", args.backend)
    backend = get_backend(args.backend)
    device = torch.device(backend.device)
    decode_kernel = None if args.decode_kernel == "auto" else args.decode_kernel
    chosen = choose_decode_kernel(decode_kernel, device)
    rope_kv_write = None if args.rope_kv_write == "auto" else args.rope_kv_write
    rope_kv = choose_rope_kv_write(rope_kv_write, device)
    decode_linear = None if args.decode_linear == "auto" else args.decode_linear
    linear = choose_decode_linear(decode_linear, device)
    greedy_ranking = None if args.greedy_ranking == "auto" else args.greedy_ranking
    ranking = choose_greedy_ranking(greedy_ranking, device)
    options = KernelOptions(decode_kernel=decode_kernel, rope_kv_write=rope_kv_write,
                            decode_linear=decode_linear, greedy_ranking=greedy_ranking)
    settings = {"auto": (None,), "off": (False,), "on": (True,), "both": (False, True)}[args.pdl]
    try:
        pdl_choices = {pdl: choose_pdl(pdl, device) for pdl in settings}
    except ValueError as error:
        print(f"harness bench capture: --pdl {args.pdl}: {error}", file=sys.stderr)
        return 2
    kernel_line = (f"decode kernel: {chosen.kernel} ({chosen.reason}); rope + KV write: "
                   f"{rope_kv.mode} ({rope_kv.reason}); decode linear: {linear.mode} "
                   f"({linear.reason}); greedy ranking: {ranking.mode} ({ranking.reason})")
    timed_threads = torch.get_num_threads()
    if args.profile:
        if len(settings) > 1:
            parser.error("--profile takes one --pdl setting, not both")
        pdl = settings[0]
        kernel_line += f"; PDL: {pdl_line(pdl_choices[pdl])}"
        name = (args.model or ["tiny"])[0]
        with torch.inference_mode():
            compile = "none" if args.compile == "both" else args.compile
            table, breakdown, device_table = profile_step(
                name, build_model(name, device), backend, args.batch, iters=args.iters,
                warmup=args.warmup, compile=compile, batches=args.capture_sizes,
                options=options.with_pdl(pdl))
        print(render_profile(table, breakdown, backend.name, args.iters))
        if device_table:
            print(device_table)
        print(f"compile: {compile}; " + kernel_line)
        return 0
    models = args.model or (["tiny", "1b"] if device.type == "cuda" else ["tiny"])
    compiles = ("none", "inductor") if args.compile == "both" else (args.compile,)
    missed_any = False
    for index, (pdl, pdl_choice) in enumerate(pdl_choices.items()):
        missed = _measure(args, backend, device, models, compiles, timed_threads,
                          kernel_line + f"; PDL: {pdl_line(pdl_choice)}",
                          heading=f"PDL {'on' if pdl_choice.enabled else 'off'}" if len(settings) > 1
                          else None, options=options.with_pdl(pdl),
                          count_kernels=index == len(pdl_choices) - 1)
        missed_any = missed_any or bool(missed)
    return 1 if args.check and missed_any else 0


def pdl_line(choice: PdlChoice) -> str:
    """The PDL setting in words, and whether inductor's own kernels follow it in this torch."""
    from harness.runtime.compiled.piece import inductor_has_pdl

    return (f"{'on' if choice.enabled else 'off'} ({choice.reason}); inductor "
            f"triton.enable_pdl {'present' if inductor_has_pdl() else 'absent'} in torch "
            f"{torch.__version__}")


def _measure(args, backend, device, models, compiles, timed_threads, kernel_line, *,
             heading: str | None, options: KernelOptions, count_kernels: bool = True) -> list[str]:
    """One set of measurements and tables for one PDL setting; the targets it missed.
    `count_kernels`: end with the kernels per replay (torch.profiler, which slows every host loop
    after it: only the process's last set counts them)."""
    batches = args.capture_sizes
    captures, replays, floors, steps, kernels, layers = [], [], {}, [], {}, {}
    with torch.inference_mode():
        for name in models:
            model = build_model(name, device)
            floors[name], layers[name] = weight_floor_ms(model), model.num_layers
            progress(f"{name}: model built" + (f" ({heading})" if heading else ""))
            captures += [time_capture(name, model, backend, compile=c, repeats=args.capture_repeats,
                                      batches=batches, options=options) for c in compiles]
            replays += time_replay(name, model, backend, iters=args.iters, warmup=args.warmup,
                                   batches=batches, options=options)
            if args.step_repeats and 1 in batches:
                steps += time_engine_steps(name, model, backend, (1,), repeats=args.step_repeats,
                                           compiles=compiles, options=options, progress=progress)
            del model
        if count_kernels and device.type == "cuda" and 1 in batches:
            for name in models:
                kernels[name] = count_replay_kernels(build_model(name, device), backend,
                                                     options=options)
    tables = [render(backend.name, captures, replays, floors, args.iters, batches=batches,
                     repeats=args.capture_repeats)]
    if steps:
        tables.append(render_steps(steps, args.step_repeats))
    tables.append(render_op_counts([op_counts(1)]))
    if kernels:
        tables.append("CUDA kernels per decode replay at batch 1 (torch.profiler; greedy graphs: the "
                      "ranking runs after the replay): " + ", ".join(
                          f"{n} {k:g} ({k / layers[n]:.1f} per layer)" for n, k in kernels.items()))
    if heading:
        tables.insert(0, f"### {heading}")
    table = "\n\n".join(tables)
    missed = misses(captures, replays) + step_misses(steps)
    print(table)
    print(machine_line(timed_threads))
    print(kernel_line)
    print("targets: " + (f"missed: {'; '.join(missed)}" if missed else "met"))
    if args.output and not args.no_write:
        append_section(args.output, "harness bench capture" + (f" ({heading})" if heading else ""),
                       table, threads=timed_threads)
        print(f"appended to {args.output}")
    return missed

