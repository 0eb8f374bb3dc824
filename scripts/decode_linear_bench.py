"""Micro-benchmark of the decode GEMV kernels (harness/ops/triton_gemv.py) against the torch ops
they replace, on the Llama-3.2-1B shapes at decode batch M (default 1), on one CUDA device.

For each of the five GEMVs of a 1B decode step (qkv with its norm, o_proj + residual, gate_up with
its norm and SiLU-and-multiply, down + residual, the final norm + lm_head) it times the separate
path's torch ops and the Triton kernel under the shape heuristic's config and a few neighbouring
configs (BLOCK_N, BLOCK_K, num_warps, split), and prints microseconds per call and the bandwidth
that is (bytes of W, x, the residual and y over the time), so that one H200 run picks the configs.

Timing: each candidate is captured into a CUDA graph of R calls, each call on its own copy of the
weights (R copies hold at least 256 MB, so no call finds its W in the 50 MB L2), and the graph's
replays are timed with CUDA events: the median of `--iters` (200) replays after `--warmup`, divided
by R. Every candidate's output is checked against the torch ops first (within 3 BF16 steps);
a config that disagrees is printed as WRONG and not timed.

    PYTHONPATH=$PWD python scripts/decode_linear_bench.py [--m 1] [--iters 200] [--quick] [--pdl both]
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python scripts/decode_linear_bench.py --dry-run   # CPU check

`--pdl both` times each candidate twice, its kernels launched without and with Programmatic
Dependent Launch (rows marked "pdl"): the graph is a chain of R calls, so with PDL each call's
weight loads may start while the call before it drains. Where PDL cannot run (compute capability
below 9.0, a triton without it) the script exits 2 naming the missing piece.

`--dry-run` runs only the correctness checks, on CPU tensors under Triton's interpreter, at
shapes divided by 16: the script's own test where there is no GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.nn.functional as F

from harness.ops.gemv_configs import GemvConfig, choose_gemv_config, sm_count

EPS = 1e-5
L2_DEFEAT_BYTES = 256 << 20
MAX_CANDIDATES = 7


@dataclass(frozen=True)
class Shape:
    """One GEMV of the step: y [m, n] from x [m, k] and W [rows, k]."""

    name: str
    op: str  # "norm_gemv" | "gemv_residual" | "norm_gemv_silu_mul"
    n: int
    k: int

    @property
    def rows(self) -> int:
        return 2 * self.n if self.op == "norm_gemv_silu_mul" else self.n

    def bytes_moved(self, m: int, itemsize: int = 2) -> int:
        extra = m * self.n if self.op == "gemv_residual" else self.k  # residual, or the norm weight
        return itemsize * (self.rows * self.k + m * self.k + m * self.n + extra)


SHAPES = (Shape("qkv (norm_gemv)", "norm_gemv", 3072, 2048),
          Shape("o_proj + residual", "gemv_residual", 2048, 2048),
          Shape("gate_up (norm_gemv_silu_mul)", "norm_gemv_silu_mul", 8192, 2048),
          Shape("down + residual", "gemv_residual", 2048, 8192),
          Shape("lm_head (norm_gemv)", "norm_gemv", 128256, 2048))
PER_LAYER = SHAPES[:4]
LAYERS = 16


@dataclass
class Operands:
    x: torch.Tensor
    weights: list[torch.Tensor]
    norm_weight: torch.Tensor
    residual: torch.Tensor


def operands(shape: Shape, m: int, device: str, copies: int) -> Operands:
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*size, scale=1.0, shift=0.0):
        return torch.randn(size, generator=gen, device=device).mul_(scale).add_(shift).bfloat16()

    return Operands(x=rand(m, shape.k, scale=2.0),
                    weights=[rand(shape.rows, shape.k, scale=shape.k ** -0.5) for _ in range(copies)],
                    norm_weight=rand(shape.k, scale=0.2, shift=1.0), residual=rand(m, shape.n))


def torch_ops(shape: Shape, ops: Operands, w: torch.Tensor) -> torch.Tensor:
    """The separate path's ops, as ReferenceLlama runs them."""
    if shape.op == "gemv_residual":
        return torch.addmm(ops.residual, ops.x, w.t())
    h = F.linear(F.rms_norm(ops.x, ops.norm_weight.shape, ops.norm_weight, EPS), w)
    if shape.op == "norm_gemv":
        return h
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def triton_call(shape: Shape, ops: Operands, w: torch.Tensor, config: GemvConfig,
                pdl: bool = False) -> torch.Tensor:
    from harness.ops.triton_gemv import gemv_triton

    if shape.op == "gemv_residual":
        return gemv_triton(ops.x, w, residual=ops.residual, config=config, pdl=pdl)
    return gemv_triton(ops.x, w, norm_weight=ops.norm_weight, eps=EPS,
                       gated=shape.op == "norm_gemv_silu_mul", config=config, pdl=pdl)


def candidates(shape: Shape, m: int, sms: int, quick: bool) -> list[GemvConfig]:
    """The heuristic's config, then its neighbours one parameter away (deduplicated)."""
    gated = shape.op == "norm_gemv_silu_mul"
    base = choose_gemv_config(m, shape.n, shape.k, sms=sms, rows_per_output=2 if gated else 1,
                              tensor_cores=True)
    if quick:
        return [base]
    if base.mma:
        row_tiles = choose_gemv_config(m, shape.n, shape.k, sms=sms,
                                       rows_per_output=2 if gated else 1)
        return [base, row_tiles, replace(base, block_n=base.block_n // 2),
                replace(base, block_k=base.block_k // 2), replace(base, num_stages=base.num_stages + 2),
                replace(base, num_warps=4)][:MAX_CANDIDATES]
    options = [base, replace(base, block_n=base.block_n * 2),
               replace(base, block_k=max(32, base.block_k // 2)),
               replace(base, block_k=min(1024, base.block_k * 2)),
               replace(base, num_warps=8 if base.num_warps == 4 else 4)]
    if base.block_n > 8:
        options.insert(1, replace(base, block_n=base.block_n // 2))
    if not gated:
        options += [replace(base, split_k=s) for s in (1, 2, 4) if s != base.split_k]
    unique: list[GemvConfig] = []
    for config in options:
        if config not in unique:
            unique.append(config)
    return unique[:MAX_CANDIDATES]


def steps_off(got: torch.Tensor, want: torch.Tensor) -> float:
    scale = torch.finfo(torch.bfloat16).eps * max(want.abs().max().item(), 1.0)
    return (got.float() - want.float()).abs().max().item() / scale


def time_graph_us(calls: Callable[[int], torch.Tensor], copies: int, iters: int, warmup: int) -> float:
    """Median microseconds per call of a CUDA graph of `copies` calls (call i on weight copy i)."""
    for i in range(copies):
        calls(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(copies):
            calls(i)
    for _ in range(warmup):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(iters):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / copies)
    return statistics.median(samples)


def bench_shape(shape: Shape, m: int, *, iters: int, warmup: int, quick: bool, dry_run: bool,
                out: Callable[[str], None], pdl_modes: tuple[bool, ...] = (False,)) -> tuple[float, float]:
    """Prints the table of one shape; returns (torch us, best Triton us). Each candidate is timed
    with every PDL mode of `pdl_modes` (True: its kernels launched with PDL, so in the graph of R
    calls each may start while the one before drains)."""
    device = "cpu" if dry_run else "cuda"
    if dry_run:
        shape = Shape(shape.name, shape.op, max(8, shape.n // 16), max(32, shape.k // 16))
    weight_bytes = shape.rows * shape.k * 2
    copies = 1 if dry_run else max(1, -(-L2_DEFEAT_BYTES // weight_bytes))
    ops = operands(shape, m, device, copies)
    sms = sm_count(torch.device(device))
    moved = shape.bytes_moved(m)
    expected = torch_ops(shape, ops, ops.weights[0])
    out(f"\n{shape.name}: M={m} N={shape.n} K={shape.k}, {moved / 1e6:.1f} MB per call, "
        f"{copies} weight copies per graph")
    out("| candidate | us | TB/s | vs torch |")
    out("|---|---:|---:|---:|")
    torch_us = float("nan")
    if not dry_run:
        torch_us = time_graph_us(lambda i: torch_ops(shape, ops, ops.weights[i]), copies, iters, warmup)
        out(f"| torch ops | {torch_us:.2f} | {moved / torch_us / 1e6:.2f} | 1.00x |")
    best = float("inf")
    for index, config in enumerate(candidates(shape, m, sms, quick)):
        for pdl in pdl_modes:
            label = (("heuristic " if index == 0 else "") + config.label()
                     + (" pdl" if pdl else ""))
            got = triton_call(shape, ops, ops.weights[0], config, pdl)
            off = steps_off(got, expected)
            if off > (5 if dry_run else 3):
                out(f"| {label} | WRONG: {off:.1f} BF16 steps from the torch ops | | |")
                continue
            if dry_run:
                out(f"| {label} | ok ({off:.2f} steps) | | |")
                continue
            us = time_graph_us(lambda i: triton_call(shape, ops, ops.weights[i], config, pdl),
                               copies, iters, warmup)
            best = min(best, us)
            out(f"| {label} | {us:.2f} | {moved / us / 1e6:.2f} | {torch_us / us:.2f}x |")
    return torch_us, best


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=1, help="decode batch rows (default 1, at most 8)")
    parser.add_argument("--iters", type=int, default=200, help="timed graph replays (default 200)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed replays first (default 10)")
    parser.add_argument("--quick", action="store_true", help="the heuristic's config only")
    parser.add_argument("--dry-run", action="store_true",
                        help="correctness only, CPU tensors under TRITON_INTERPRET=1, small shapes")
    parser.add_argument("--pdl", choices=("off", "on", "both"), default="off",
                        help="launch the Triton kernels with Programmatic Dependent Launch: off "
                             "(default), on, or both (each candidate twice); needs compute "
                             "capability >= 9.0 and a triton with it")
    args = parser.parse_args(argv)
    if not 1 <= args.m <= 8 or args.iters < 1 or args.warmup < 0:
        parser.error(f"--m must be in [1, 8], --iters >= 1, --warmup >= 0; got {args.m}, "
                     f"{args.iters}, {args.warmup}")
    if not args.dry_run and not torch.cuda.is_available():
        print("decode_linear_bench: needs a CUDA device (or --dry-run under TRITON_INTERPRET=1)",
              file=sys.stderr)
        return 2
    pdl_modes = {"off": (False,), "on": (True,), "both": (False, True)}[args.pdl]
    if True in pdl_modes:
        from harness.ops.pdl_choice import pdl_blocker

        blocker, _ = pdl_blocker(torch.device("cuda" if not args.dry_run else "cpu"))
        if blocker is not None:
            print(f"decode_linear_bench: --pdl {args.pdl} cannot run here: {blocker}", file=sys.stderr)
            return 2
    out = print
    if not args.dry_run:
        props = torch.cuda.get_device_properties(0)
        out(f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, bf16, "
            f"median of {args.iters} graph replays")
    results = {}
    with torch.inference_mode():
        for shape in SHAPES:
            results[shape.name] = bench_shape(shape, args.m, iters=args.iters, warmup=args.warmup,
                                              quick=args.quick, dry_run=args.dry_run, out=out,
                                              pdl_modes=pdl_modes)
    if args.dry_run:
        return 0
    layer_torch = sum(results[s.name][0] for s in PER_LAYER)
    layer_best = sum(results[s.name][1] for s in PER_LAYER)
    lm_torch, lm_best = results[SHAPES[-1].name]
    out(f"\nper layer (4 GEMVs): torch ops {layer_torch:.1f} us, best Triton {layer_best:.1f} us; "
        f"per step ({LAYERS} layers + lm_head): torch {LAYERS * layer_torch + lm_torch:.0f} us, "
        f"best Triton {LAYERS * layer_best + lm_best:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
