"""One architecture's audit row: build it tiny, run it eagerly with a static cache, check that run
against a cache-free forward, capture its decode step, replay it, compare with eager, classify.

`harness.audit.runner` calls `audit_architecture` in a process of its own per architecture, so a
crash or a hang loses one row. `python -m harness.audit.classify MODEL_TYPE [--dtype D]
[--graph-backend B]` runs one architecture in the foreground (its warnings visible) and prints the
row as one JSON line, for looking into a single verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import warnings
from dataclasses import asdict, dataclass

import torch

from harness.adapters.transformers import TransformersRuntime
from harness.audit.tiny import Architecture, BuildError, build_tiny, causal_lm_architectures
from harness.check import compare_generations
from harness.graphs import CaptureError, get_backend
from harness.graphs.emulator.callsite import traceback_callsite
from harness.ranking import rank_logits, steps_from_ranked
from harness.records import Generation, Request, Step

AGREES = "agrees"
CAPTURE_ERROR = "capture error"
DIVERGES = "diverges"
NO_STATIC_CACHE = "no static cache"
BUILD_ERROR = "build error"
CRASHED = "crashed"
TIMEOUT = "timeout"
VERDICTS = (AGREES, CAPTURE_ERROR, DIVERGES, NO_STATIC_CACHE, BUILD_ERROR, CRASHED, TIMEOUT)

# Two rows of one prompt length (a static cache has one write position); the prefill is eager and
# the four decode steps after it are replays of one capture.
PROMPTS = ([5, 9, 3, 7, 11, 4], [8, 6, 12, 10, 3, 13])
NEW_TOKENS = 5
MAX_CACHE_LEN = 32
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass(frozen=True)
class Row:
    """One architecture's verdict. `step` is the first diverging step (the prefill is step 0);
    `detail` the reason, the op and source line, or the divergence."""

    model_type: str
    class_name: str
    dtype: str
    backend: str
    verdict: str
    detail: str = ""
    step: int | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Row:
        return cls(**data)


def requests() -> list[Request]:
    return [Request(list(p), NEW_TOKENS, logprobs=3) for p in PROMPTS]


def audit_architecture(arch: Architecture, dtype: str, backend_name: str,
                       device: str | None = None) -> Row:
    """`device`: where the model lives and the backend captures (None: the backend's default); "cuda"
    inside `harness.emulate_cuda()` is the emulated device, captured through torch.cuda.graph."""
    start = time.perf_counter()

    def row(verdict: str, detail: str = "", step: int | None = None) -> Row:
        return Row(arch.model_type, arch.class_name, dtype, backend_name, verdict, detail, step,
                   round(time.perf_counter() - start, 2))

    backend = get_backend(backend_name, device=device)
    try:
        model = build_tiny(arch, DTYPES[dtype], device=str(backend.device))
    except BuildError as error:
        return row(BUILD_ERROR, str(error))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            oracle = cache_free_generations(model, requests())
        except Exception as error:
            return row(BUILD_ERROR, f"builds, but a cache-free forward raised {_describe(error)}")
        try:
            eager = TransformersRuntime(model, max_cache_len=MAX_CACHE_LEN).generate(requests())
        except Exception as error:
            return row(NO_STATIC_CACHE, f"eager with a StaticCache raised {_describe(error)}")
        against_oracle = compare_generations(oracle, eager)
        if not against_oracle.ok:
            first = against_oracle.divergences[0]
            return row(NO_STATIC_CACHE, f"eager with a StaticCache disagrees with a cache-free forward "
                                        f"at step {first.step} ({first.kind}): the model ignores the "
                                        f"cache or attends differently with it", first.step)
        runtime = TransformersRuntime(model, backend=backend, graph_sizes=(len(PROMPTS),),
                                      max_cache_len=MAX_CACHE_LEN)
        try:
            graphed = runtime.generate(requests())
        except CaptureError as error:
            # CUDA's message, then the harness's op and line (the refusals' two-line form).
            return row(CAPTURE_ERROR, _first_line(error, lines=2))
        except Exception as error:
            # Not a CaptureError: the op failed under the backend (on the emulator, often a fidelity bug).
            return row(CAPTURE_ERROR, f"not a CaptureError: {_describe(error)}")
    comparison = compare_generations(eager, graphed)
    if comparison.ok:
        return row(AGREES)
    first = comparison.divergences[0]
    return row(DIVERGES, f"{first.kind} divergence from eager at step {first.step} of request "
                         f"{first.request} ({first.producer}): {first.detail}", first.step)


@torch.inference_mode()
def cache_free_generations(model, batch: list[Request]) -> list[Generation]:
    """Greedy generation recomputing the whole sequence every step, no cache at all: what a static
    cache run must agree with."""
    device = next(model.parameters()).device
    sequences = torch.tensor([r.prompt for r in batch], dtype=torch.int64, device=device)
    steps: list[list[Step]] = [[] for _ in batch]
    for _ in range(max(r.max_new_tokens for r in batch)):
        logits = model(input_ids=sequences, use_cache=False).logits[:, -1]
        ranked = rank_logits(logits, max(r.logprobs for r in batch))
        for row, step in enumerate(steps_from_ranked(ranked, [r.logprobs for r in batch], "cache-free")):
            steps[row].append(step)
        sequences = torch.cat([sequences, ranked.order[:, :1]], dim=1)
    return [Generation.from_steps(s[:r.max_new_tokens]) for s, r in zip(steps, batch)]


def _describe(error: BaseException) -> str:
    where = _innermost_transformers_frame(error)
    return f"{type(error).__name__}: {_first_line(error)}" + (f" (at {where})" if where else "")


def _innermost_transformers_frame(error: BaseException) -> str:
    return traceback_callsite(error.__traceback__, in_file=lambda name: f"{os.sep}transformers{os.sep}" in name)


def _first_line(error: BaseException, lines: int = 1) -> str:
    text = str(error).strip().splitlines()[:lines]
    # Paths inside the venv are the same on every machine from site-packages on.
    return re.sub(r"\S*site-packages/", "", ": ".join(text))[:400]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.audit.classify")
    parser.add_argument("model_type")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--graph-backend", default="emulated")
    args = parser.parse_args(argv)
    archs = {a.model_type: a for a in causal_lm_architectures()}
    if args.model_type not in archs:
        parser.error(f"unknown causal LM model_type {args.model_type!r}")
    torch.set_num_threads(1)
    row = audit_architecture(archs[args.model_type], args.dtype, args.graph_backend)
    sys.stdout.write("\nAUDIT-ROW " + json.dumps(row.to_dict()) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
