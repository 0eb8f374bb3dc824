"""Collectives captured in a graph, with two real processes: a correct data-parallel step agrees
with eager on every replay (the ProcessGroup API with Work.wait(), and functional collectives with
wait_tensor), a collective never waited for is CUDA's unjoined-work error at capture, and
`agree_on_graph` catches two ranks about to replay different graphs.

Both ranks run collective_worker.py (gloo on CPU with the emulator; nccl on two GPUs with CUDA
graphs), each bounded by a timeout so a rank stuck in a collective fails the test."""

from __future__ import annotations

from pathlib import Path

import pytest

from suites.distributed._ranks import PROCESS_GROUPS, run_ranks

WORKER = Path(__file__).with_name("collective_worker.py")
WORLD = 2
TIMEOUT_S = 120

pytestmark = pytest.mark.multirank

@pytest.fixture(scope="module", params=PROCESS_GROUPS)
def ranks(request, tmp_path_factory) -> list[dict]:
    pg_backend, device = request.param
    folder = tmp_path_factory.mktemp(f"collectives-{pg_backend}")
    return run_ranks(WORKER, pg_backend, device, folder, world=WORLD, timeout_s=TIMEOUT_S)


def _result(rank_results: dict, name: str) -> dict:
    result = rank_results[name]
    if "error" in result:
        pytest.fail(result["error"])
    return result


@pytest.mark.parametrize("scenario", ["process_group", "functional"])
def test_a_data_parallel_step_agrees_with_eager_on_every_replay(ranks, scenario):
    for rank_results in ranks:
        assert _result(rank_results, scenario)["agree"] == [True] * 5


@pytest.mark.parametrize("scenario, remedy", [("unwaited_process_group", "Work.wait()"),
                                              ("unwaited_functional", "wait_tensor()")])
def test_a_collective_never_waited_for_fails_the_capture(ranks, scenario, remedy):
    for rank_results in ranks:
        result = _result(rank_results, scenario)
        assert result["raised"] is not None
        if result["raised"] == "CaptureError":  # the emulator; CUDA words it its own way
            assert "unjoined" in result["message"] and remedy in result["message"]
            assert "collective_worker.py" in result["message"]


def test_ranks_that_disagree_on_the_graph_are_caught_before_the_collective(ranks):
    for rank_results in ranks:
        result = _result(rank_results, "disagreement")
        assert result["raised"] and result["keys"] == ["decode[bs=4]", "decode[bs=2]"]
        assert "rank 0: decode[bs=4], rank 1: decode[bs=2]" in result["message"]
        assert "at step 1" in result["message"]
