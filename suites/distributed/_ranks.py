"""Running a world of rank processes for the multirank tests, and the rank side of it.

The test side (`run_ranks`) starts one process per rank, bounds them all by one timeout (a rank
stuck in an unmatched collective fails the test instead of stalling CI) and returns each rank's
JSON results, failing with every rank's log tail otherwise. The rank side (`rank_main`) joins the
process group, runs the scenarios in order under the fault the parent session planted, and
writes their results (or the first failing one's traceback) to its file.

    python WORKER RANK WORLD PORT BACKEND DEVICE OUT_JSON
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count()


# gloo on CPU with the emulator; nccl on two GPUs with CUDA graphs.
PROCESS_GROUPS = [
    pytest.param(("gloo", "cpu"), id="gloo-cpu"),
    pytest.param(("nccl", "cuda"), id="nccl-cuda", marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(_cuda_devices() < 2, reason="needs 2 CUDA devices")]),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(worker: Path, pg_backend: str, device: str, folder: Path, *, world: int,
              timeout_s: float) -> list[dict]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "NCCL_NVLS_ENABLE": "0"}
    env.pop("HARNESS_SKIP_WARMUP_PASS", None)
    outs = [folder / f"rank{rank}.json" for rank in range(world)]
    procs = [subprocess.Popen([sys.executable, str(worker), str(rank), str(world), str(port),
                               pg_backend, device, str(outs[rank])], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(world)]
    logs, timed_out = [], False
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=max(deadline - time.monotonic(), 1))[0])
        except subprocess.TimeoutExpired:
            timed_out = True
            for other in procs:
                other.kill()
            logs.append(proc.communicate()[0])
    text = "\n".join(f"--- rank {r} (exit {p.returncode}) ---\n{log[-6000:]}"
                     for r, (p, log) in enumerate(zip(procs, logs)))
    if timed_out:
        pytest.fail(f"a rank did not finish within {timeout_s} s (a hang in a collective?):\n{text}")
    if any(p.returncode for p in procs):
        pytest.fail(f"a rank failed:\n{text}")
    return [json.loads(out.read_text()) for out in outs]


def rank_main(argv: list[str], scenarios: Callable[..., dict[str, Callable[[], dict]]]) -> int:
    """Join the world, then run `scenarios(rank, world, device, backend)`'s entries in order."""
    import torch
    import torch.distributed as dist

    rank, world, port = int(argv[0]), int(argv[1]), int(argv[2])
    pg_backend, device_type, out = argv[3], argv[4], argv[5]
    device = torch.device(device_type if device_type == "cpu" else f"cuda:{rank}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(pg_backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    results: dict[str, dict] = {}
    failed = True
    try:
        from harness.faults import inherited_fault
        from harness.graphs import get_backend

        backend = get_backend("emulated" if device.type == "cpu" else "cuda", device)
        with inherited_fault(backend.name):  # a fault the parent session planted reaches the ranks
            for name, run in scenarios(rank, world, device, backend).items():
                try:
                    results[name] = run()
                except Exception:
                    results[name] = {"error": traceback.format_exc()}
                    raise  # the peers may be waiting in a collective: stop rather than run on
        failed = False
    finally:
        with open(out, "w") as handle:
            json.dump(results, handle)
        if failed:
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        # The results are written: leave without the process group's teardown, which aborted a rank
        # now and then ("terminate called without an active exception", one run in three on the
        # 2-core machine) after a scenario had left a collective's work unwaited on purpose.
        os._exit(1 if failed else 0)
