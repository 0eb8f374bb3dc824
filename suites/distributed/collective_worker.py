"""One rank of the captured-collective scenarios, run as a script by test_captured_collectives.py.

    python collective_worker.py RANK WORLD PORT BACKEND DEVICE OUT_JSON

A data-parallel step (a shared linear layer on this rank's rows, the activations reduced and
gathered over the ranks) is captured once and replayed over new inputs; each replay is compared
with the same step run eagerly. Then captures that never wait for their collective, and ranks
that disagree on the graph they replay. Every scenario's result (or traceback) goes to OUT_JSON.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from harness.runtime.async_io import all_reduce_in_graph

STEPS = 5
ROWS, WIDTH = 4, 8


def process_group_step(x: torch.Tensor, weight: torch.Tensor, gathered: torch.Tensor):
    def step():
        hidden = all_reduce_in_graph(x @ weight)
        dist.all_gather_into_tensor(gathered, torch.relu(hidden) * (dist.get_rank() + 1))
        return hidden * 2, gathered.sum(dim=0)
    return step


def functional_step(x: torch.Tensor, weight: torch.Tensor):
    def step():
        hidden = x @ weight
        summed = funcol.all_reduce(hidden, "sum", dist.group.WORLD)
        everyone = funcol.all_gather_tensor(torch.tanh(summed) + dist.get_rank(), 0, dist.group.WORLD)
        return summed + 1, everyone * 3
    return step


def unwaited_process_group_step(x: torch.Tensor):
    def step():
        hidden = x * 2
        dist.all_reduce(hidden, async_op=True)  # the Work is dropped, never waited for
        return hidden + 1
    return step


def unwaited_functional_step(x: torch.Tensor):
    def step():
        return torch.ops._c10d_functional.all_reduce(x * 2, "sum", dist.group.WORLD.group_name)
    return step


def replays_agree(backend, step, x: torch.Tensor, rank: int) -> dict:
    graph = backend.capture(step)
    agree = []
    for i in range(STEPS):
        x.copy_(torch.arange(x.numel(), dtype=x.dtype, device=x.device).view_as(x) * (i + 1)
                + rank * 10)
        graph.replay()
        backend.synchronize()
        replayed = [t.clone() for t in graph.output]
        eager = step()
        agree.append(all(torch.equal(a, b) for a, b in zip(replayed, eager)))
    return {"agree": agree}


def capture_error(backend, step) -> dict:
    try:
        backend.capture(step)
    except Exception as error:  # the backend's own error type: CaptureError or CUDA's RuntimeError
        return {"raised": type(error).__name__, "message": str(error)}
    return {"raised": None}


def disagreement(comm, rank: int) -> dict:
    from harness.runtime.comm import GraphDisagreementError, agree_on_graph

    agree_on_graph("decode[bs=4]", comm, step=0)  # the same key everywhere passes
    try:
        agree_on_graph("decode[bs=4]" if rank == 0 else "decode[bs=2]", comm, step=1)
    except GraphDisagreementError as error:
        return {"raised": True, "message": str(error), "keys": error.keys}
    return {"raised": False}


def scenarios(rank: int, world: int, device: torch.device, backend) -> dict:
    from harness.runtime.comm import TorchDistributedComm

    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.manual_seed(0)
    weight = torch.randn(WIDTH, WIDTH, device=device)
    x = torch.zeros(ROWS, WIDTH, device=device)
    gathered = torch.zeros(world * ROWS, WIDTH, device=device)
    return {
        "process_group": lambda: replays_agree(backend, process_group_step(x, weight, gathered), x, rank),
        "functional": lambda: replays_agree(backend, functional_step(x, weight), x, rank),
        "unwaited_process_group": lambda: capture_error(backend, unwaited_process_group_step(x)),
        "unwaited_functional": lambda: capture_error(backend, unwaited_functional_step(x)),
        "disagreement": lambda: disagreement(TorchDistributedComm(device), rank),
    }


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _ranks import rank_main

    sys.exit(rank_main(sys.argv[1:], scenarios))
