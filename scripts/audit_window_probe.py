#!/usr/bin/env python3
"""Where a tiny sliding-window model fails when its window is shorter than the audit's sequences:
issue 26's "Mistral with an 8-token window, bf16". On the H200 (torch 2.11) it builds and runs its
cache-free forward, then the graphed run's replay past the window trips index_copy_'s device-side
assert; the emulated device raises CUDA's AcceleratorError for the same replayed op
(docs/audit-transformers.md). The audit calls a failure of the cache-free forward a "build error",
so this runs the audit's phases one by one (build, cache-free forward, eager with a StaticCache, the graphed
run) and prints the first error of each, and the first masked SDPA call (the query's and the
mask's shapes, strides and dtypes: the call whose kernel CUDA picks differently from the CPU).

    python scripts/audit_window_probe.py                      # natively: on the GPU
    python scripts/audit_window_probe.py --emulate-cuda       # inside harness.emulate_cuda()
    python scripts/audit_window_probe.py --dtype float32 --window 8 --arch mistral
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import harness  # noqa: E402
from harness.audit import classify, tiny  # noqa: E402


def _first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:300]}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="mistral", help="a causal LM model_type with sliding_window")
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--dtype", choices=sorted(classify.DTYPES), default="bfloat16")
    parser.add_argument("--emulate-cuda", action="store_true")
    args = parser.parse_args()

    configured = tiny.tiny_config

    def windowed(model_type):
        config = configured(model_type)
        config.sliding_window = args.window
        return config

    tiny.tiny_config = windowed  # build_tiny looks it up at call time
    masked_calls = []
    sdpa = F.scaled_dot_product_attention

    def logging_sdpa(query, key, value, attn_mask=None, *rest, **kwargs):
        if attn_mask is not None and not masked_calls:
            masked_calls.append(f"query {tuple(query.shape)} {query.dtype}; mask {tuple(attn_mask.shape)} "
                                f"strides {attn_mask.stride()} {attn_mask.dtype}")
        return sdpa(query, key, value, attn_mask, *rest, **kwargs)

    F.scaled_dot_product_attention = logging_sdpa
    arch = {a.model_type: a for a in tiny.causal_lm_architectures()}[args.arch]
    where = harness.emulate_cuda() if args.emulate_cuda else contextlib.nullcontext()
    print(f"torch {torch.__version__}, cuda available {torch.cuda.is_available()}, "
          f"{'emulated' if args.emulate_cuda else 'native'}, {args.arch}, window {args.window}, {args.dtype}")
    with where:
        try:
            model = tiny.build_tiny(arch, classify.DTYPES[args.dtype], device="cuda")
            print("build: ok")
        except Exception as error:
            print("build:", _first_line(error))
            return 0
        try:
            classify.cache_free_generations(model, classify.requests())
            torch.cuda.synchronize()  # a kernel's device-side error surfaces at a sync on CUDA
            print("cache-free forward: ok")
        except Exception as error:
            print("cache-free forward:", _first_line(error))
        print("first masked SDPA call:", masked_calls[0] if masked_calls else "none")
        backend = "emulated" if args.emulate_cuda else "cuda"
        row = classify.audit_architecture(arch, args.dtype, backend, device="cuda")
        print(f"audit row: {row.verdict}: {row.detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
