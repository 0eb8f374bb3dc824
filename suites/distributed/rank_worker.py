"""One rank of the multirank decoder-graph scenarios, run as a script by test_multirank.py.

    python rank_worker.py RANK WORLD PORT BACKEND DEVICE OUT_JSON

Every scenario runs on every rank, in order; each writes its capture reports (or its traceback) to
OUT_JSON, so one failing scenario does not hide the others, and the test shows a failing rank's
traceback. A hang is bounded by the process-group timeout and by the test's process timeout.
"""

from __future__ import annotations

import datetime
import json
import sys
import traceback
from dataclasses import asdict, replace

import torch
import torch.distributed as dist

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


def main(argv: list[str]) -> int:
    rank, world, port = int(argv[0]), int(argv[1]), int(argv[2])
    pg_backend, device_type, out = argv[3], argv[4], argv[5]
    device = torch.device(device_type if device_type == "cpu" else f"cuda:{rank}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(pg_backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    results: dict[str, dict] = {}
    try:
        from harness.graphs import get_backend
        from harness.model import ReferenceLlama, tiny_llama
        from harness.runtime.comm import TorchDistributedComm

        comm = TorchDistributedComm(device)
        model = ReferenceLlama.from_hf(tiny_llama(seed=0)).to(device)
        backend = get_backend("emulated" if device.type == "cpu" else "cuda", device)
        from harness.faults import inherited_fault

        with inherited_fault(backend.name):  # a fault the parent session planted reaches the ranks
            for name, (overrides, regrow) in scenarios(rank).items():
                try:
                    results[name] = run_scenario(model, backend, comm, overrides, regrow, device)
                except Exception:
                    results[name] = {"error": traceback.format_exc()}
                    raise  # the peers may be waiting in a collective: stop rather than run on
    finally:
        with open(out, "w") as handle:
            json.dump(results, handle)
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
