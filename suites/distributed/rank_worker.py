"""One rank of the multirank decoder-graph scenarios, run as a script by test_multirank.py.

    python rank_worker.py RANK WORLD PORT BACKEND DEVICE OUT_JSON

Every scenario runs on every rank, in order; each writes its capture reports (or its traceback) to
OUT_JSON, so one failing scenario does not hide the others, and the test shows a failing rank's
traceback. A hang is bounded by the process-group timeout and by the test's process timeout.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch

from harness.check import compare_generations

SIZES = (4, 2, 1)


def scenarios(rank: int):
    """name -> (config overrides, whether to force a workspace regrowth) for this rank."""
    return {
        # Only rank 0 sets the switch: both ranks stay on two passes.
        "switch_on_one_rank": (dict(single_pass_capture=rank == 0), False),
        # Both set it; a tensor moves on rank 0 only: both discard the single pass and fall back.
        "moved_on_one_rank": (dict(single_pass_capture=True), rank == 0),
        # Rank 1's KV cache holds 3 blocks: too few for the dummy batch of size 4.
        "kv_too_small_on_one_rank": (dict(single_pass_capture=True, num_blocks=3 if rank == 1 else None),
                                     False),
    }


class RegrowAfterFirstCapture:
    """Wraps the model's forward: the first eager forward after a capture (the second shape's
    warmup, in a single pass) regrows the workspace, as a smaller shape needing more scratch would."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.forward = engine.model.forward
        self.captured = self.regrown = False

    def __call__(self, *args):
        if self.engine.backend.is_capturing():
            self.captured = True
        elif self.captured and not self.regrown:
            self.regrown = True
            workspace = self.engine.model.workspace
            workspace.get(2 * workspace.capacity)
        return self.forward(*args)


def run_scenario(model, backend, comm, overrides: dict, regrow: bool, device: torch.device) -> dict:
    from fixtures.models import TINY_ENGINE_CONFIG, mixed_requests
    from harness.runtime import Engine

    config = replace(TINY_ENGINE_CONFIG, max_batch_size=4, decode_graph_sizes=SIZES, **overrides)
    engine = Engine(model, config, backend=backend, comm=comm)
    engine.decode_graphs.warmup_and_capture("estimate")
    engine.decode_graphs.release()
    if regrow:
        engine.model.forward = RegrowAfterFirstCapture(engine)
    try:
        engine.finalize_kv_cache()
    finally:
        vars(engine.model).pop("forward", None)  # the model is shared by the scenarios
    requests = mixed_requests(prompt_lens=(3, 5), max_new_tokens=(3, 2), logprobs=2)
    eager = Engine(model, replace(TINY_ENGINE_CONFIG, max_batch_size=4)).generate(requests)
    generated = engine.generate(requests)
    comparison = compare_generations(eager, generated)
    return {"reports": [asdict(r) for r in engine.capture_reports],
            "agrees_with_eager": comparison.ok,
            "comparison": str(comparison),
            "fallbacks": dict(engine.stats.fallbacks)}


def rank_scenarios(rank: int, world: int, device: torch.device, backend) -> dict:
    from harness.model import ReferenceLlama, tiny_llama
    from harness.runtime.comm import TorchDistributedComm

    comm = TorchDistributedComm(device)
    model = ReferenceLlama.from_hf(tiny_llama(seed=0)).to(device)
    return {name: (lambda o=overrides, r=regrow: run_scenario(model, backend, comm, o, r, device))
            for name, (overrides, regrow) in scenarios(rank).items()}


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _ranks import rank_main

    sys.exit(rank_main(sys.argv[1:], rank_scenarios))
