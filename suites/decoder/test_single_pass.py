"""b. Single-pass capture, and c. its fallback when a captured tensor moves (forced workspace regrowth).

The regrowth is forced before the second capture of the final phase, as a smaller shape needing more
scratch would: the graph captured first baked in the old workspace, whose memory is freed.
"""

from __future__ import annotations

import logging

import pytest
import torch

from harness.check import compare_generations
from harness.graphs import FreedMemoryError


def test_single_pass_keeps_the_keys_and_runs_one_pass_in_the_final_phase(make_engine, two_pass_run,
                                                                         decode_requests, eager_decode):
    baseline_engine, baseline = two_pass_run
    engine = make_engine(single_pass_capture=True)
    generations = engine.generate(decode_requests)
    stats = engine.stats
    assert set(stats.captures) == set(baseline_engine.stats.captures)
    assert dict(stats.replays) == dict(baseline_engine.stats.replays)
    assert dict(stats.capture_passes) == {"estimate": 2, "serve": 1}
    estimate, serve = engine.capture_reports
    assert (estimate.single_pass_tried, serve.single_pass_tried, serve.fell_back) == (False, True, False)
    assert not stats.fallbacks
    for reference in (baseline, eager_decode):
        comparison = compare_generations(reference, generations)
        assert comparison.ok, str(comparison)


def final_phase_forwards(engine) -> int:
    """Model forwards (eager, or recorded by a capture) of the final phase."""
    engine.decode_graphs.warmup_and_capture("estimate")
    engine.decode_graphs.release()
    calls = []
    handle = engine.model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        engine.finalize_kv_cache()
    finally:
        handle.remove()
    return len(calls)


def test_the_single_pass_does_nothing_twice(make_engine):
    # Two passes: the eager-workspace reservation, then per size a warmup-only forward, a warmup
    # forward and a capture. One pass: per size a warmup forward and a capture; the reservation the
    # estimation phase made is not repeated.
    sizes = len(make_engine().config.decode_graph_sizes)
    assert final_phase_forwards(make_engine()) == 1 + 3 * sizes
    assert final_phase_forwards(make_engine(single_pass_capture=True)) == 2 * sizes
    # Two sampling variants per size: the second captures without warming the model again.
    variants = dict(graph_top_k=(1, 2))
    assert final_phase_forwards(make_engine(**variants)) == 1 + 5 * sizes
    assert final_phase_forwards(make_engine(single_pass_capture=True, **variants)) == 3 * sizes


def test_the_environment_switch_opts_in(monkeypatch, make_engine):
    monkeypatch.setenv("HARNESS_SKIP_WARMUP_PASS", "1")
    engine = make_engine()
    assert engine.config.single_pass_capture
    engine.prepare_graphs()
    assert engine.capture_reports[-1].passes == 1


class ForcedRegrowth:
    """Regrows the model's workspace before the second shape's warmup forward (after the first
    capture) of the final phase. On CUDA a tensor of the old size then takes the freed address
    (the canary); a graph that still uses it writes into the canary."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.calls = 0
        self.canary: torch.Tensor | None = None
        graphs = engine.decode_graphs
        self._warmup_forward = graphs._warmup_forward
        graphs._warmup_forward = self

    def __call__(self, size: int) -> None:
        self.calls += 1
        if self.calls == 2:
            workspace = self.engine.model.workspace
            old = workspace.capacity
            workspace.get(2 * old)
            self.canary = torch.full((old,), 3.0, dtype=workspace.dtype, device=workspace.device)
        self._warmup_forward(size)

    def canary_clobbered(self) -> bool:
        return bool((self.canary != 3.0).any())


def _capture_with_forced_regrowth(engine) -> ForcedRegrowth:
    engine.decode_graphs.warmup_and_capture("estimate")
    engine.decode_graphs.release()
    regrowth = ForcedRegrowth(engine)
    engine.finalize_kv_cache()
    return regrowth


def test_a_moved_workspace_discards_the_single_pass_and_falls_back(make_engine, two_pass_run,
                                                                    decode_requests, eager_decode, caplog):
    baseline_engine, baseline = two_pass_run
    engine = make_engine(single_pass_capture=True)
    with caplog.at_level(logging.WARNING, logger="harness.runtime.decode.graphs"):
        regrowth = _capture_with_forced_regrowth(engine)
    assert regrowth.calls > 2 and engine.model.workspace.growths >= 1
    report = engine.capture_reports[-1]
    assert report.single_pass_tried and report.fell_back and report.passes == 3
    assert "decode[bs=8,greedy]: workspace.tensor" in report.moved
    assert "workspace.tensor: data pointer changed from" in caplog.text
    assert engine.decode_graphs.runner.moved_tensors() == []  # the two passes captured the new one
    generations = engine.generate(decode_requests)
    stats = engine.stats
    assert set(stats.captures) == set(baseline_engine.stats.captures)
    assert dict(stats.replays) == dict(baseline_engine.stats.replays)
    assert dict(stats.fallbacks) == {"single-pass capture discarded: a captured tensor moved": 1}
    assert not regrowth.canary_clobbered()
    for reference in (baseline, eager_decode):
        comparison = compare_generations(reference, generations)
        assert comparison.ok, str(comparison)


def test_with_the_fallback_switched_off_the_stale_graph_fails(make_engine, decode_requests, eager_decode):
    engine = make_engine(single_pass_capture=True)
    engine.decode_graphs.fallback_on_moved = False
    regrowth = _capture_with_forced_regrowth(engine)
    report = engine.capture_reports[-1]
    assert report.single_pass_tried and not report.fell_back and report.moved
    if engine.backend.name == "emulated":
        # The emulator makes the stale address visible instead of letting replay use it.
        with pytest.raises(FreedMemoryError, match="freed"):
            engine.generate(decode_requests)
        return
    generations = engine.generate(decode_requests)
    comparison = compare_generations(eager_decode, generations)
    # On CUDA the stale graph writes its scratch into the freed workspace's new owner, the canary.
    assert not comparison.ok or regrowth.canary_clobbered(), (
        "a graph that baked in the freed workspace replayed without any visible effect")
