"""One data-parallel rank of test_dp_ranks_pad_by_local_count.py, run as a script:

    python _dp_padding_worker.py RANK WORLD PORT BACKEND DEVICE OUT_JSON

A miniature of vLLM #25906 / SGLang #16237: each rank pads its batch to a captured size and runs
the step's collective (an all-reduce of the padded hidden states, as an MoE or TP layer does). The
buggy runtime pads by its local token count, so the ranks choose different graphs; the fixed one
pads to the global maximum. Both call the harness's check with their graph key first.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from harness.check import GraphDisagreementError, agree_on_graph_key

BUCKETS = (4, 8)
LOCAL_TOKENS = (3, 6)  # rank 0 and rank 1 this step


def _padded(n: int) -> int:
    return next(b for b in BUCKETS if b >= n)


def _step(rank: int, device: torch.device, tokens: int) -> dict:
    key = f"decode bs={tokens}"
    agree_on_graph_key(key)
    hidden = torch.full((tokens, 4), float(rank + 1), device=device)
    dist.all_reduce(hidden)
    return {"key": key, "sum": float(hidden.sum())}


def scenarios(rank: int, world: int, device: torch.device, backend) -> dict:
    local = LOCAL_TOKENS[rank]

    def padded_by_local_count() -> dict:
        try:
            _step(rank, device, _padded(local))
        except GraphDisagreementError as error:
            return {"raised": type(error).__name__, "message": str(error), "keys": error.keys}
        return {"raised": None}

    def padded_to_the_global_max() -> dict:
        longest = torch.tensor([local], device=device)
        dist.all_reduce(longest, op=dist.ReduceOp.MAX)
        return _step(rank, device, _padded(int(longest.item())))

    return {"padded_by_local_count": padded_by_local_count,
            "padded_to_the_global_max": padded_to_the_global_max}


if __name__ == "__main__":
    from suites.distributed._ranks import rank_main

    sys.exit(rank_main(sys.argv[1:], scenarios))
