"""`harness bench explain`: how long `harness explain` takes on the 2-core CPU machine. Target (the
explain issue): an explain of a tiny model's step in under 30 s.

Cases, each the median wall time of `--repeat` runs, model building and capture included:

- `tiny-step`: the reference engine on the tiny Llama, one decode graph of batch 8, eight requests of
  two new tokens: one prefill, one decode step replayed and compared op by op with eager. Beside it
  the same run on the plain emulated backend, without the explanation.
- `fault`: `harness explain --fault max-seq-len-baked`, a whole reproduction (four decode graphs,
  eight requests of 8-16 tokens) up to its first divergent op.
- `sliding-window`: the transformers adapter on a tiny Mistral, up to the mask built from the
  Python int frozen at capture.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import warnings
from typing import Callable

import torch

from harness.bench._report import add_output_options, append_section, machine_line, require_at_least

TARGET_S = 30.0


def _tiny_engine_run(backend) -> None:
    from harness.model import ReferenceLlama, tiny_llama
    from harness.records import Request
    from harness.runtime import Engine, EngineConfig

    model = ReferenceLlama.from_hf(tiny_llama(0))
    config = EngineConfig(max_batch_size=8, max_num_tokens=256, block_size=16, max_model_len=128,
                          decode_graph_sizes=(8,))
    rng = random.Random(0)
    requests = [Request([rng.randrange(512) for _ in range(n)], 2) for n in (3, 7, 12, 19, 26, 33, 40, 5)]
    engine = Engine(model, config, backend=backend)
    engine.prepare_graphs()
    engine.generate(requests)


def _tiny_step() -> str:
    from harness.check import explain_divergence

    explanation = explain_divergence(_tiny_engine_run, steps=0)
    return f"{explanation.replays_compared} replays, {explanation.ops_compared} ops, diverged: {explanation.diverged}"


def _tiny_plain() -> str:
    from harness.graphs import get_backend

    _tiny_engine_run(get_backend("emulated"))
    return "no explanation"


def _fault() -> str:
    from harness.repro.explain import explain_fault

    explanation = explain_fault("max-seq-len-baked")
    return f"{explanation.op} at {explanation.where.split(': ')[0]}"


def _sliding_window() -> str:
    from harness.adapters.transformers import TransformersRuntime
    from harness.audit.classify import MAX_CACHE_LEN, PROMPTS, requests
    from harness.audit.tiny import Architecture, build_tiny
    from harness.check import explain_divergence

    model = build_tiny(Architecture("mistral", "MistralForCausalLM"), torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        explanation = explain_divergence(
            lambda backend: TransformersRuntime(model, backend=backend, graph_sizes=(len(PROMPTS),),
                                                max_cache_len=MAX_CACHE_LEN), requests=requests())
    return f"{explanation.op} at {explanation.where.split(': ')[0].split('site-packages/')[-1]}"


# The plain run first: it pays the imports and kernel warmup, not the explanation.
CASES: dict[str, Callable[[], str]] = {"tiny-step (plain emulated)": _tiny_plain, "tiny-step": _tiny_step,
                                       "fault": _fault, "sliding-window": _sliding_window}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="harness bench explain", description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per case, median kept (default 3)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch intra-op threads (default: torch's, one per core)")
    add_output_options(parser)
    args = parser.parse_args(argv)
    require_at_least(parser, args, 1, "repeat", "threads")
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        table, verdict = _measure(args.repeat)
    finally:
        torch.set_num_threads(threads)  # main() also runs inside test processes
    print(table)
    print(verdict)
    print(machine_line(args.threads))
    if args.output and not args.no_write:
        append_section(args.output, "harness bench explain", f"{table}\n\n{verdict}", threads=args.threads)
        print(f"appended to {args.output}")
    return 0


def _measure(repeat: int) -> tuple[str, str]:
    rows = ["| case | wall (median) | runs | result |", "| --- | --- | --- | --- |"]
    missed = []
    for name, case in CASES.items():
        times, result = [], ""
        for _ in range(repeat):
            start = time.perf_counter()
            result = case()
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        if name == "tiny-step" and median > TARGET_S:
            missed.append(name)
        rows.append(f"| {name} | {median:.1f} s | {', '.join(f'{t:.1f}' for t in times)} | {result} |")
    verdict = (f"target: an explain of the tiny model's step under {TARGET_S:.0f} s: "
               f"{'missed' if missed else 'met'}")
    return "\n".join(rows), verdict
