"""Data-parallel ranks that pick their graph by local token count (vLLM #25906, SGLang #16237):
two real processes, gloo on CPU and nccl on two GPUs. `agree_on_graph_key`, called by the runtime
with its graph key before the step's collective, makes every rank raise a GraphDisagreementError
naming the key each rank chose instead of hanging in mismatched collectives; padding to the
global maximum passes it and the collective completes."""

from __future__ import annotations

from pathlib import Path

import pytest

from suites.distributed._ranks import PROCESS_GROUPS, run_ranks

WORKER = Path(__file__).with_name("_dp_padding_worker.py")

pytestmark = pytest.mark.multirank


@pytest.fixture(scope="module", params=PROCESS_GROUPS)
def ranks(request, tmp_path_factory) -> list[dict]:
    pg_backend, device = request.param
    folder = tmp_path_factory.mktemp(f"dp-padding-{pg_backend}")
    return run_ranks(WORKER, pg_backend, device, folder, world=2, timeout_s=120)


def test_padding_by_local_count_is_caught_on_every_rank_with_each_ranks_key(ranks):
    for result in ranks:
        caught = result["padded_by_local_count"]
        assert caught["raised"] == "GraphDisagreementError", caught
        assert caught["keys"] == ["decode bs=4", "decode bs=8"]
        assert "rank 0: decode bs=4, rank 1: decode bs=8" in caught["message"]


def test_padding_to_the_global_max_agrees_and_the_collective_completes(ranks):
    for result in ranks:
        step = result["padded_to_the_global_max"]
        assert step["key"] == "decode bs=8"
        assert step["sum"] == 8 * 4 * 3.0  # both ranks' rows of 1s and 2s, reduced
