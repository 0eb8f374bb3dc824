"""The host work of one decode step through `Engine.generate` (decode graphs with on-device top-1
ranking, overlap on or off), measured on the CPU with the emulated graph backend: the host Python
is the same code that runs on a GPU machine, only the replay differs, and it is taken out.

Time is this thread's CPU time (`time.thread_time`, torch on one thread), which other processes on
a shared machine do not inflate as they do wall time. Each graph replay is timed where the engine
calls it (`GraphRunner.replay`, wrapped for this run) and subtracted from the generation's time; a generation of NEW_TOKENS tokens minus one of 1
token, over the NEW_TOKENS - 1 decode steps between them, cancels the prefill and the per-call
work. Prints the median host microseconds per step over `--repeats`, then the top host functions
under cProfile (replay excluded from their totals only where they call it).

    python scripts/profile_decode_host.py [--overlap] [--repeats 15] [--model tiny]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch

from harness.bench.capture import build_model
from harness.graphs import get_backend
from harness.records import Request
from harness.runtime import Engine, EngineConfig

PROMPT, NEW_TOKENS = 16, 48


def engine_for(model, overlap: bool) -> Engine:
    config = EngineConfig(max_batch_size=1, max_num_tokens=PROMPT, block_size=16,
                          max_model_len=PROMPT + NEW_TOKENS + 16, decode_graph_sizes=(1,),
                          graph_top_k=(1,), overlap=overlap)
    engine = Engine(model, config, backend=get_backend("emulated"))
    engine.prepare_graphs()
    return engine


def timed_replays(engine: Engine) -> list[float]:
    """Seconds of every graph replay from now on, appended as they happen."""
    runner = engine.decode_graphs.runner
    replay, spent = runner.replay, []

    def timed(key):
        start = time.thread_time()
        try:
            return replay(key)
        finally:
            spent.append(time.thread_time() - start)
    runner.replay = timed
    return spent


def host_seconds(engine: Engine, requests: list[Request], spent: list[float]) -> float:
    spent.clear()
    start = time.thread_time()
    engine.generate(requests)
    return time.thread_time() - start - sum(spent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", choices=("tiny", "1b"))
    parser.add_argument("--overlap", action="store_true")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = build_model(args.model, torch.device("cpu"))
    engine = engine_for(model, args.overlap)
    vocab = model.vocab_size
    prompt = [(7 * i + 1) % vocab for i in range(PROMPT)]
    long = [Request(prompt=prompt, max_new_tokens=NEW_TOKENS, logprobs=1)]
    short = [Request(prompt=prompt, max_new_tokens=1, logprobs=1)]
    engine.generate(long)  # first-use work
    spent = timed_replays(engine)
    samples = []
    for _ in range(args.repeats):
        samples.append((host_seconds(engine, long, spent) - host_seconds(engine, short, spent))
                       / (NEW_TOKENS - 1))
    print(f"host work per decode step ({args.model}, batch 1, overlap "
          f"{'on' if args.overlap else 'off'}, emulated backend, CPU): median "
          f"{statistics.median(samples) * 1e6:.1f} us, min {min(samples) * 1e6:.1f} us over "
          f"{args.repeats} repeats")
    calls = {}
    for name, requests in (("long", long), ("short", short)):
        profile = cProfile.Profile()
        profile.enable()
        engine.generate(requests)
        profile.disable()
        calls[name] = pstats.Stats(profile)
    per_step = (calls["long"].total_calls - calls["short"].total_calls) / (NEW_TOKENS - 1)
    # Counted, not timed: the same on any machine, for one code.
    print(f"Python function calls per decode step (cProfile, replay included): {per_step:.0f}")
    if args.top:
        calls["long"].sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
