"""g. Rank agreement with two real processes: the switch, a move on one rank, an unbuildable shape.

Both ranks run rank_worker.py over torch.distributed (gloo on CPU with the emulator; nccl on two
GPUs with CUDA graphs). Each process is bounded by a timeout, so a rank stuck in an unmatched
collective fails the test instead of stalling CI; a failing rank's traceback is in the report.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("rank_worker.py")
WORLD = 2
TIMEOUT_S = 180

pytestmark = pytest.mark.multirank

PROCESS_GROUPS = [
    pytest.param(("gloo", "cpu"), id="gloo-cpu"),
    pytest.param(("nccl", "cuda"), id="nccl-cuda", marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module", params=PROCESS_GROUPS)
def ranks(request, tmp_path_factory) -> list[dict]:
    """Each rank's results by scenario, from one run of two processes."""
    pg_backend, device = request.param
    folder = tmp_path_factory.mktemp(f"ranks-{pg_backend}")
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "NCCL_NVLS_ENABLE": "0"}
    outs = [folder / f"rank{rank}.json" for rank in range(WORLD)]
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(rank), str(WORLD), str(port), pg_backend,
                               device, str(outs[rank])], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for rank in range(WORLD)]
    logs, timed_out = [], False
    deadline = time.monotonic() + TIMEOUT_S
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
        pytest.fail(f"a rank did not finish within {TIMEOUT_S} s (a hang in a collective?):\n{text}")
    if any(p.returncode for p in procs):
        pytest.fail(f"a rank failed:\n{text}")
    return [json.loads(out.read_text()) for out in outs]


def _serve(result: dict) -> dict:
    if "error" in result:
        pytest.fail(result["error"])
    return result["reports"][-1]


def test_a_rank_without_the_switch_keeps_both_on_two_passes(ranks):
    serve = [_serve(r["switch_on_one_rank"]) for r in ranks]
    assert [s["single_pass_requested"] for s in serve] == [True, False]
    paths = [(s["single_pass_tried"], s["passes"]) for s in serve]
    assert paths == [(False, 2), (False, 2)], (
        f"the ranks took different capture paths (single pass tried, passes) by rank: {paths}; a rank "
        f"without the switch must keep every rank on two passes")
    assert serve[0]["keys"] == serve[1]["keys"]
    assert all(r["switch_on_one_rank"]["agrees_with_eager"] for r in ranks), \
        [r["switch_on_one_rank"]["comparison"] for r in ranks]


def test_a_tensor_moved_on_one_rank_makes_both_fall_back(ranks):
    serve = [_serve(r["moved_on_one_rank"]) for r in ranks]
    assert serve[0]["moved"] and not serve[1]["moved"]
    assert [(s["single_pass_tried"], s["fell_back"], s["passes"]) for s in serve] == [(True, True, 3)] * 2
    assert serve[0]["keys"] == serve[1]["keys"] == ["decode[bs=1,greedy]", "decode[bs=2,greedy]",
                                                    "decode[bs=4,greedy]"]
    assert all(r["moved_on_one_rank"]["agrees_with_eager"] for r in ranks), \
        [r["moved_on_one_rank"]["comparison"] for r in ranks]


def test_a_shape_one_rank_cannot_build_is_skipped_by_both(ranks):
    serve = [_serve(r["kv_too_small_on_one_rank"]) for r in ranks]
    assert [s["skipped_sizes"] for s in serve] == [[4], [4]]
    assert serve[0]["keys"] == serve[1]["keys"] == ["decode[bs=1,greedy]", "decode[bs=2,greedy]"]
    assert [(s["single_pass_tried"], s["fell_back"]) for s in serve] == [(True, False)] * 2
