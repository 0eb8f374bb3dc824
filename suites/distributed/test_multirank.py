"""g. Rank agreement with two real processes: the switch, a move on one rank, an unbuildable shape.

Both ranks run rank_worker.py over torch.distributed (gloo on CPU with the emulator; nccl on two
GPUs with CUDA graphs). Each process is bounded by a timeout, so a rank stuck in an unmatched
collective fails the test instead of stalling CI; a failing rank's traceback is in the report.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from suites.distributed._ranks import PROCESS_GROUPS, run_ranks

WORKER = Path(__file__).with_name("rank_worker.py")
WORLD = 2
TIMEOUT_S = 180

pytestmark = pytest.mark.multirank

@pytest.fixture(scope="module", params=PROCESS_GROUPS)
def ranks(request, tmp_path_factory) -> list[dict]:
    """Each rank's results by scenario, from one run of two processes."""
    pg_backend, device = request.param
    folder = tmp_path_factory.mktemp(f"ranks-{pg_backend}")
    return run_ranks(WORKER, pg_backend, device, folder, world=WORLD, timeout_s=TIMEOUT_S)


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
