"""`harness bench piecewise`: prefill of one prompt through piecewise graphs against the eager
forward, for 16, 64 and 256-token prompts (each exactly a bucket, so no padding is timed). Target
(docs/design.md, "Performance targets"): piecewise/eager <= 0.8 at 16 and 64 tokens. On cuda the
kernels one piecewise run launches are counted too (torch.profiler).

Both run the same engine's prepared batch: eager is `ReferenceLlama.forward`, piecewise is the
engine's `PiecewiseGraphs.run` (static pieces replayed, attention eager between them, lm_head on the
last row). Each ratio comes from one run: the median of many timed iterations after warmup, the two
taking turns within every iteration. On CUDA every call is followed by a synchronize.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from harness.bench._report import (add_output_options, append_section, machine_line,
                                   refuse_fallbacks, require_at_least)
from harness.bench.timing import median_ms
from harness.cli_support import require_cuda

PROMPTS = (16, 64, 256)
TARGET = 0.8  # piecewise/eager at the short prompts
SHORT_PROMPTS = (16, 64)


@dataclass(frozen=True)
class Timing:
    tokens: int
    eager_ms: float
    piecewise_ms: float
    kernels: float | None = None  # CUDA kernels one piecewise run launches (graphs and eager attention)

    @property
    def ratio(self) -> float:
        return self.piecewise_ms / self.eager_ms


def build_engine(shape: str, device: torch.device, prompts: tuple[int, ...]):
    from harness.graphs import get_backend
    from harness.model import ReferenceLlama, llama_1b_config, random_llama, tiny_llama
    from harness.runtime import Engine, EngineConfig

    hf = tiny_llama(seed=0) if shape == "tiny" else random_llama(llama_1b_config(), seed=0)
    model = ReferenceLlama.from_hf(hf).to(device)
    del hf
    backend = get_backend("cuda" if device.type == "cuda" else "emulated", device=device)
    longest = max(prompts)
    config = EngineConfig(max_batch_size=1, max_num_tokens=longest, block_size=16,
                          max_model_len=longest + 16, piecewise_buckets=tuple(sorted(prompts)))
    engine = Engine(model, config, backend=backend)
    engine.prepare_graphs()  # captures every bucket, as a serving runtime does at startup
    return engine


def measure(engine, tokens: int, *, iters: int, warmup: int) -> Timing:
    from harness.runtime.scheduler import ScheduledBatch

    from harness.ops import SequenceSpan

    blocks = engine.kv_cache.allocator.allocate(engine.kv_cache.blocks_for(tokens))
    try:
        ids = tuple((7 * i + 3) % engine.model.vocab_size for i in range(tokens))
        span = SequenceSpan(seq_len=tokens, query_len=tokens, block_table=tuple(blocks))
        engine._prepare(ScheduledBatch(sequences=(None,), num_prefills=1, spans=(span,), input_ids=ids),
                        num_tokens=tokens)
        sync = engine.backend.synchronize

        def eager() -> torch.Tensor:
            logits = engine.model(engine.input_ids, engine.metadata, engine.kv_cache)
            sync()
            return logits

        def piecewise() -> torch.Tensor:
            logits = engine.piecewise.run(1, tokens)
            sync()
            return logits

        expected, actual = eager(), piecewise()
        gap = (expected - actual).abs().max().item()
        if not torch.allclose(expected, actual, rtol=0.05, atol=0.25):
            raise RuntimeError(f"{tokens} tokens: piecewise logits differ from eager by up to {gap}")
        with torch.no_grad():
            eager_ms, piecewise_ms = median_ms(eager, piecewise, iters=iters, warmup=warmup)
            kernels = None
            if engine.device.type == "cuda":
                from harness.bench._kernels import cuda_kernels_per_replay

                kernels = cuda_kernels_per_replay(piecewise)
    finally:
        engine.kv_cache.allocator.free(blocks)
    refuse_fallbacks(engine, f"{tokens} tokens: the piecewise run")
    return Timing(tokens, eager_ms, piecewise_ms, kernels)


def render(timings: list[Timing], *, shape: str, device: torch.device, iters: int) -> str:
    lines = [f"Piecewise prefill vs eager, {shape} model on {device}, one prompt, bf16, median of "
             f"{iters} iterations (target ratio <= {TARGET:.2f} at {' and '.join(map(str, SHORT_PROMPTS))} "
             f"tokens)", "",
             "| prompt tokens | eager ms | piecewise ms | piecewise/eager | CUDA kernels per run |",
             "|---:|---:|---:|---:|---:|"]
    lines += [f"| {t.tokens} | {t.eager_ms:.3f} | {t.piecewise_ms:.3f} | {t.ratio:.2f}x | "
              f"{'-' if t.kernels is None else f'{t.kernels:g}'} |" for t in timings]
    missed = [f"{t.tokens} tokens {t.ratio:.2f}x > {TARGET:.2f}" for t in timings
              if t.tokens in SHORT_PROMPTS and t.ratio > TARGET]
    lines += ["", "targets: " + (f"missed: {'; '.join(missed)}" if missed else "met")]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="harness bench piecewise", description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=100, help="timed iterations (default 100)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed iterations first (default 10)")
    parser.add_argument("--shape", choices=("tiny", "1b"), default="tiny",
                        help="model shape: the tiny seeded model or the Llama-1B shape (default tiny)")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--prompt", type=int, action="append",
                        help=f"prompt length (repeatable; default {', '.join(map(str, PROMPTS))})")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads on CPU (default 1)")
    add_output_options(parser)
    args = parser.parse_args(argv)
    require_at_least(parser, args, 1, "iters", "threads")
    require_at_least(parser, args, 0, "warmup")
    prompts = tuple(args.prompt or PROMPTS)
    if min(prompts) < 2:
        parser.error(f"--prompt must be at least 2 (the smallest bucket), got {min(prompts)}")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        require_cuda(f"--device {args.device}", "use --device cpu")

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        engine = build_engine(args.shape, device, prompts)
        timings = [measure(engine, n, iters=args.iters, warmup=args.warmup) for n in prompts]
    finally:
        torch.set_num_threads(threads)  # main() also runs inside test processes
    table = render(timings, shape=args.shape, device=device, iters=args.iters)
    print(table)
    print(machine_line(args.threads))
    if args.output and not args.no_write:
        append_section(args.output, "harness bench piecewise", table, threads=args.threads)
        print(f"appended to {args.output}")
    return 0
