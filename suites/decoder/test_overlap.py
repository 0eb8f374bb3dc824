"""The overlap loop with decode graphs: the generations of the loop without overlap on the session's
graph backend (exactly on the emulator), and, on CUDA, under a stalled stream that opens every
window the loop's synchronization closes (the detector of the overlap faults)."""

from __future__ import annotations

import pytest
import torch

from fixtures.models import step_values
from harness.check.compare import compare_generations

STALL_CYCLES = 20_000_000  # about 10 ms on an H200: longer than a tiny decode step's host work


@pytest.mark.parametrize("graph_top_k", [pytest.param((), marks=pytest.mark.slow), (2,)],
                         ids=["host-ranked-graphs", "graph-ranked"])
def test_overlap_with_decode_graphs_matches_the_loop_without(make_engine, decode_requests, graph_top_k,
                                                            graph_backend):
    expected = make_engine(graph_top_k=graph_top_k).generate(decode_requests)
    engine = make_engine(graph_top_k=graph_top_k, overlap=True)
    actual = engine.generate(decode_requests)
    comparison = compare_generations(expected, actual)
    assert comparison.ok, str(comparison)
    if graph_backend.name == "emulated":
        assert step_values(actual) == step_values(expected)
    assert sum(engine.stats.replays.values()) > 0
    assert not engine.stats.fallbacks, dict(engine.stats.fallbacks)


def stall_stream() -> None:
    torch.cuda._sleep(STALL_CYCLES)


@pytest.mark.gpu
def test_overlap_under_a_stalled_stream_matches_the_loop_without(make_engine, decode_requests,
                                                                  graph_backend):
    """Every step's device work is queued behind a sleep: the host runs ahead as far as the loop
    lets it, so a staging buffer reused too early, tokens read before their event or inputs written
    outside the stream order show up as different tokens."""
    if graph_backend.name != "cuda":
        pytest.skip("stalls a CUDA stream")
    expected = make_engine(graph_top_k=(2,)).generate(decode_requests)
    engine = make_engine(graph_top_k=(2,), overlap=True)
    engine.prepare_graphs()
    torch.cuda.synchronize()
    engine.before_launch = stall_stream
    actual = engine.generate(decode_requests)
    comparison = compare_generations(expected, actual)
    assert comparison.ok, f"overlap under a stalled stream: {comparison}"
