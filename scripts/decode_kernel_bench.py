"""Time the paged-decode kernel per layer on a CUDA GPU: the kernel of main 18cefd5
(`decode_kernel_baseline.py`: one program per row and kv head, one page per iteration) against
the split-sequence kernel (`harness/ops/triton_decode.py`) at its defaults, with tiles of 64
slots and with one split, for batch 1/4/16 at context 64, 512 and 2048.

The 1B shape: 32 q heads, 8 kv heads, head_dim 64, block size 16, bf16. The block table is as wide
as `--table-factor` times the context (the engine's bench sizes max_model_len at twice the
context), which sets the default split count. Two timings per variant, each the median of
`--iters` CUDA-event intervals: "graph" replays a CUDA graph of `--layers` launches (how the
engine runs it) and divides by the launches; "eager" is one launch between two events (launch
latency included). Before timing, every variant's output is compared with the baseline's.

`--pdl` adds the split kernel at its defaults launched with Programmatic Dependent Launch ("new
pdl"); where PDL cannot run it exits naming the missing piece.

    python scripts/decode_kernel_bench.py [--pdl]    # about 30 s on an H200
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from decode_kernel_baseline import paged_decode_triton as baseline_kernel  # noqa: E402

from harness.ops.triton_decode import decode_splits, paged_decode_triton  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 64, 16


def make_inputs(batch: int, context: int, table_tokens: int, gen: torch.Generator) -> dict:
    max_blocks = -(-table_tokens // BLOCK_SIZE)
    num_blocks = batch * max_blocks + 1
    kv = torch.randn(2, num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=gen).to(
        "cuda", torch.bfloat16)
    tables = torch.randperm(num_blocks - 1, generator=gen)[: batch * max_blocks]
    return dict(
        q=torch.randn(batch, HEADS, HEAD_DIM, generator=gen).to("cuda", torch.bfloat16),
        kv_layer=kv,
        positions=torch.full((batch,), context - 1, dtype=torch.int64, device="cuda"),
        token_to_seq=torch.arange(batch, dtype=torch.int64, device="cuda"),
        seq_lens=torch.full((batch,), context, dtype=torch.int32, device="cuda"),
        block_tables=tables.view(batch, max_blocks).to("cuda", torch.int64),
        scale=HEAD_DIM ** -0.5)


def launcher(kind: str, **options):
    kernel = baseline_kernel if kind == "baseline" else paged_decode_triton

    def launch(inputs: dict, out: torch.Tensor) -> None:
        kernel(inputs["q"], inputs["kv_layer"], inputs["positions"], inputs["token_to_seq"],
               inputs["seq_lens"], inputs["block_tables"], inputs["scale"], out, **options)
    return launch


def median_us(launch, inputs: dict, out: torch.Tensor, iters: int, layers: int) -> tuple[float, float]:
    """(graph: per launch inside a graph of `layers` launches, eager: one launch), microseconds."""
    launch(inputs, out)  # compiles before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(layers):
            launch(inputs, out)
    graph.replay()
    times = {"graph": [], "eager": []}
    for _ in range(iters):
        for mode in times:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay() if mode == "graph" else launch(inputs, out)
            end.record()
            end.synchronize()
            times[mode].append(start.elapsed_time(end) * 1000 / (layers if mode == "graph" else 1))
    return statistics.median(times["graph"]), statistics.median(times["eager"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--contexts", type=int, nargs="+", default=[64, 512, 2048])
    parser.add_argument("--table-factor", type=int, default=2)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--pdl", action="store_true",
                        help="add the split kernel launched with Programmatic Dependent Launch "
                             "(\"new pdl\"): in the graph of --layers launches each may start "
                             "while the one before drains")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("decode_kernel_bench needs a CUDA GPU (torch.cuda.is_available() is False)")
    if args.pdl:
        from harness.ops.pdl_choice import pdl_blocker

        blocker, _ = pdl_blocker(torch.device("cuda"))
        if blocker is not None:
            raise SystemExit(f"decode_kernel_bench: --pdl cannot run here: {blocker}")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"heads {HEADS}/{KV_HEADS}, head_dim {HEAD_DIM}, block {BLOCK_SIZE}, bf16; "
          f"us per layer, median of {args.iters}")
    variants = {"baseline": launcher("baseline"), "new": launcher("new"),
                "new tile64": launcher("new", tile_tokens=64),
                "new 1 split": launcher("new", num_splits=1)}
    if args.pdl:
        variants["new pdl"] = launcher("new", pdl=True)
    print("| batch | context | splits | " + " | ".join(f"{v} graph / eager" for v in variants)
          + " | new/baseline (graph) | max |new-baseline| |")
    print("|---:|---:|---:|" + "---:|" * (len(variants) + 2))
    gen = torch.Generator().manual_seed(0)
    for batch in args.batches:
        for context in args.contexts:
            inputs = make_inputs(batch, context, args.table_factor * context, gen)
            outs = {name: torch.zeros_like(inputs["q"]) for name in variants}
            for name, launch in variants.items():
                launch(inputs, outs[name])
            torch.cuda.synchronize()
            error = max((outs[n].float() - outs["baseline"].float()).abs().max().item()
                        for n in variants)
            timed = {name: median_us(launch, inputs, outs[name], args.iters, args.layers)
                     for name, launch in variants.items()}
            splits = decode_splits(batch, KV_HEADS, inputs["block_tables"].shape[1] * BLOCK_SIZE)
            cells = " | ".join(f"{g:.1f} / {e:.1f}" for g, e in timed.values())
            print(f"| {batch} | {context} | {splits} | {cells} | "
                  f"{timed['new'][0] / timed['baseline'][0]:.2f} | {error:.3g} |", flush=True)


if __name__ == "__main__":
    main()
