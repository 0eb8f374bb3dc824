"""`harness bench emulator`: emulated graph replay against eager for a 4-layer tiny decode step on
CPU. Target (docs/design.md, "Performance targets"): replay no slower than eager, ratio replay/eager
<= 1.0; the reference model's decode step (at most 0.9x) is not timed here.

Two steps are timed: a hand-written Llama-shaped step over a static KV cache, and transformers'
LlamaForCausalLM (seeded random weights, no download) with a StaticCache. Each ratio comes from one
run: the median of many timed iterations after warmup. A second table (_emulated_device.py) times
the same steps on the emulated CUDA device against CPU eager, a third (_tracked_eager.py) with its
stream tracking on, in issue order and under the adversarial schedule.
"""

from __future__ import annotations

import argparse
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from harness.bench._report import add_output_options, append_section, machine_line, require_at_least
from harness.bench._tracking import TRACKING_TARGET, measure_tracking, render_tracking
from harness.bench.timing import median_ms
from harness.bench._tiny_decoder import TinyDecoder, TinyDecoderConfig
from harness.bench._emulated_device import EAGER_TARGET, measure_device, render_device
from harness.bench._tracked_eager import (ADVERSARIAL_TARGET, TRACKED_TARGET, measure_tracked_eager,
                                          render_tracked_eager)
from harness.graphs import get_backend

TARGET = 1.0


@dataclass(frozen=True)
class Timing:
    case: str
    eager_ms: float
    replay_ms: float
    ops: int

    @property
    def ratio(self) -> float:
        return self.replay_ms / self.eager_ms


def _hand_written(batch: int, device: str = "cpu") -> tuple[Callable, Callable]:
    """(eager step, capture fn) on two decoders with the same weights and inputs."""
    config = TinyDecoderConfig(batch=batch)
    eager, graphed = TinyDecoder(config, seed=0, device=device), TinyDecoder(config, seed=0, device=device)
    for decoder in (eager, graphed):
        decoder.tokens.copy_(torch.arange(batch) * 7 % config.vocab)
        decoder.positions.copy_(torch.arange(batch) % config.max_seq)
    return eager.step, graphed.step


def _transformers_llama(batch: int, device: str = "cpu") -> tuple[Callable, Callable]:
    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

    shape = TinyDecoderConfig()  # the same shape as the hand-written case
    config = LlamaConfig(hidden_size=shape.hidden, num_hidden_layers=shape.layers,
                         num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                         intermediate_size=shape.intermediate, vocab_size=shape.vocab,
                         max_position_embeddings=128)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16).to(device).eval()

    def step_on(cache: StaticCache) -> Callable[[], torch.Tensor]:
        tokens = (torch.arange(batch, device=device) * 7 % config.vocab_size)[:, None]
        positions = torch.full((batch, 1), 3, device=device)
        cache_position = torch.tensor([3], device=device)
        kwargs = dict(input_ids=tokens, position_ids=positions, cache_position=cache_position,
                      past_key_values=cache, use_cache=True)
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model(**kwargs)  # StaticCache allocates its layers on first use, outside the graph
            for layer in cache.layers:
                layer.keys.zero_()
                layer.values.zero_()

        def step() -> torch.Tensor:
            # The cache counts its own length on device; holding it fixed keeps every timed step
            # at the same position instead of running off the end of the cache.
            for layer in cache.layers:
                layer.cumulative_length.fill_(3)
            return model(**kwargs).logits

        return step

    return (step_on(StaticCache(config=config, max_cache_len=64)),
            step_on(StaticCache(config=config, max_cache_len=64)))


CASES: dict[str, Callable[..., tuple[Callable, Callable]]] = {
    "hand-written decode step": _hand_written,
    "transformers Llama decode step": _transformers_llama,
}


def measure(case: str, *, batch: int, iters: int, warmup: int) -> Timing:
    eager_step, capture_fn = CASES[case](batch)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = get_backend("emulated").capture(capture_fn)
        graph.replay()
        expected = eager_step()
        if not torch.equal(graph.output, expected):
            raise RuntimeError(f"{case}: replay disagrees with eager by up to "
                               f"{(graph.output.float() - expected.float()).abs().max().item()}")
        eager_ms, replay_ms = median_ms(eager_step, graph.replay, iters=iters, warmup=warmup)
    return Timing(case, eager_ms, replay_ms, graph.num_ops)


def render(timings: list[Timing], *, batch: int, iters: int) -> str:
    lines = [f"Emulated replay vs eager, {TinyDecoderConfig.layers} layers, batch {batch}, bf16, "
             f"median of {iters} iterations "
             f"(target ratio <= {TARGET:.2f})", "",
             "| case | eager ms | replay ms | replay/eager | replayed ops |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {t.case} | {t.eager_ms:.3f} | {t.replay_ms:.3f} | {t.ratio:.2f}x | {t.ops} |"
              for t in timings]
    return "\n".join(lines)


def verdict(missed: list[tuple[str, float, float]]) -> str:
    """The run's last line: each figure above its target, with its ratio and that target."""
    if not missed:
        return "every target met"
    return "targets missed: " + "; ".join(f"{name} {ratio:.2f}x > {target:.2f}x"
                                         for name, ratio, target in missed)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="harness bench emulator", description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=300, help="timed iterations (default 300)")
    parser.add_argument("--warmup", type=int, default=30, help="untimed iterations first (default 30)")
    parser.add_argument("--batch", type=int, default=4, help="decode batch size (default 4)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: these steps are per-op overhead, "
                             "and more threads only add OpenMP noise on a shared machine)")
    parser.add_argument("--case", choices=sorted(CASES), action="append",
                        help="run only this case (repeatable; default all)")
    parser.add_argument("--no-tracking", action="store_true",
                        help="skip the replay with stream tracking on vs off on the emulated "
                             f"CUDA device (target <= {TRACKING_TARGET:.2f}x)")
    parser.add_argument("--no-device", action="store_true",
                        help="skip the emulated CUDA device's table (eager on it vs CPU eager)")
    parser.add_argument("--no-tracked-eager", action="store_true",
                        help="skip eager on the emulated CUDA device with stream tracking on, in "
                             f"issue order (target <= {TRACKED_TARGET:.1f}x CPU eager) and "
                             f"adversarial (target <= {ADVERSARIAL_TARGET:.1f}x)")
    add_output_options(parser)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a ratio is above its target")
    args = parser.parse_args(argv)
    require_at_least(parser, args, 1, "iters", "batch", "threads")
    require_at_least(parser, args, 0, "warmup")

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        timings = [measure(case, batch=args.batch, iters=args.iters, warmup=args.warmup)
                   for case in (args.case or list(CASES))]
        device_timings = [] if args.no_device else [
            measure_device(case, CASES[case], batch=args.batch, iters=args.iters, warmup=args.warmup)
            for case in (args.case or list(CASES))]
        tracked_eager = [] if args.no_tracked_eager else [
            measure_tracked_eager(case, CASES[case], batch=args.batch, iters=args.iters,
                                  warmup=args.warmup)
            for case in (args.case or list(CASES))]
        tracking = None if args.no_tracking else measure_tracking(
            median_ms, batch=args.batch, iters=args.iters, warmup=args.warmup)
    finally:
        torch.set_num_threads(threads)  # main() also runs inside test processes
    table = render(timings, batch=args.batch, iters=args.iters)
    if device_timings:
        table += "\n\n" + render_device(device_timings, batch=args.batch, iters=args.iters)
    missed = [(t.case, t.ratio, TARGET) for t in timings if t.ratio > TARGET]
    missed += [(f"{t.case} (device eager)", t.eager_ratio, EAGER_TARGET)
               for t in device_timings if t.eager_ratio > EAGER_TARGET]
    missed += [(f"{t.case} (device replay)", t.replay_ratio, TARGET)
               for t in device_timings if t.replay_ratio > TARGET]
    if tracked_eager:
        table += "\n\n" + render_tracked_eager(tracked_eager, batch=args.batch, iters=args.iters)
    missed += [(f"{t.case} (tracked eager)", t.tracked_ratio, TRACKED_TARGET)
               for t in tracked_eager if t.tracked_ratio > TRACKED_TARGET]
    missed += [(f"{t.case} (adversarial eager)", t.adversarial_ratio, ADVERSARIAL_TARGET)
               for t in tracked_eager if t.adversarial_ratio > ADVERSARIAL_TARGET]
    if tracking is not None:
        table += "\n\n" + render_tracking(tracking, batch=args.batch, iters=args.iters)
        if tracking.ratio > TRACKING_TARGET:
            missed.append(("replay with stream tracking", tracking.ratio, TRACKING_TARGET))
    print(table)
    print(machine_line(args.threads))
    print(verdict(missed))
    if args.output and not args.no_write:
        append_section(args.output, "harness bench emulator", table, threads=args.threads)
        print(f"appended to {args.output}")
    return 1 if args.check and missed else 0
