"""b. Single-pass capture, and c. its fallback when a captured tensor moves (forced workspace regrowth).

The regrowth is forced before the second capture of the final phase, as a smaller shape needing more
scratch would: the graph captured first baked in the old workspace, whose memory is freed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import pytest
import torch

from harness.check import compare_generations
from harness.graphs import FreedMemoryError
from harness.runtime import EngineConfig
from harness.runtime.config import engine_defaults_from_env, fill_unset
from harness.runtime.decode.agreement import RankAgreement
from harness.runtime.decode.policy import CapturePolicy


def test_single_pass_keeps_the_keys_and_runs_one_pass_in_the_final_phase(make_engine, two_pass_run,
                                                                         decode_requests, eager_decode,
                                                                         overlap):
    baseline_engine, baseline = two_pass_run
    engine = make_engine(single_pass_capture=True, overlap=overlap)
    generations = engine.generate(decode_requests)
    stats = engine.stats
    assert set(stats.captures) == set(baseline_engine.stats.captures)
    if not overlap:  # the overlap loop replays one extra step, whose tokens it drops
        assert dict(stats.replays) == dict(baseline_engine.stats.replays)
    assert dict(stats.capture_passes) == {"estimate": 2, "serve": 1}, (
        f"capture passes per phase {dict(stats.capture_passes)}: the estimation phase must run both "
        f"passes and the final phase one")
    estimate, serve = engine.capture_reports
    assert (estimate.single_pass_tried, serve.single_pass_tried, serve.fell_back) == (False, True, False)
    assert not stats.fallbacks
    for reference in (baseline, eager_decode):
        comparison = compare_generations(reference, generations)
        assert comparison.ok, str(comparison)


def final_phase_forwards(engine) -> int:
    """Model steps (eager, or recorded by a capture) of the final phase: the model's forwards, and
    on the compiled path the compiled step's calls (its decode graphs warm up and capture that
    step, which never calls the model's forward)."""
    engine.decode_graphs.warmup_and_capture("estimate")
    engine.decode_graphs.release()
    calls = []
    graphs = engine.decode_graphs
    step = graphs.step
    if step is not None:
        def counted_step(*args):
            calls.append(1)
            return step(*args)

        graphs.step = counted_step
    handle = engine.model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        engine.finalize_kv_cache()
    finally:
        handle.remove()
        graphs.step = step
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


def test_the_single_pass_snapshots_once_per_graph(make_engine, monkeypatch):
    # Each graph's records are one snapshot, taken after its capture; the moved-tensor check after
    # the last capture compares with that capture's records instead of walking the runtime again.
    engine = make_engine(single_pass_capture=True)
    graphs = engine.decode_graphs
    graphs.warmup_and_capture("estimate")
    graphs.release()
    runner, snapshots = graphs.runner, []
    snapshot = runner.snapshot
    monkeypatch.setattr(runner, "snapshot", lambda: snapshots.append(1) or snapshot())
    engine.finalize_kv_cache()
    report = engine.capture_reports[-1]
    assert (report.passes, report.fell_back, report.moved) == (1, False, ())
    assert len(runner) > 1 and len(snapshots) == len(runner), (len(snapshots), len(runner))


def test_the_environment_fills_only_an_unset_switch(make_engine):
    defaults = engine_defaults_from_env({"HARNESS_SKIP_WARMUP_PASS": "1"})
    assert defaults == {"single_pass_capture": True}
    assert engine_defaults_from_env({}) == {} == engine_defaults_from_env({"HARNESS_SKIP_WARMUP_PASS": "0"})
    given = EngineConfig(single_pass_capture=False)
    for explicit in (given, EngineConfig.from_dict(given.to_dict()), replace(EngineConfig(), single_pass_capture=False)):
        assert fill_unset(explicit, defaults).single_pass_capture is False
    assert fill_unset(EngineConfig(), defaults).single_pass_capture is True
    assert EngineConfig().single_pass_capture is None
    with pytest.raises(ValueError, match=r"unknown EngineConfig fields \['single_pass'\] in defaults"):
        fill_unset(EngineConfig(), {"single_pass": True})
    with pytest.raises(ValueError, match="single_pass_capture must be True, False or None"):
        EngineConfig(single_pass_capture="1")
    engine = make_engine(single_pass_capture=fill_unset(EngineConfig(), defaults).single_pass_capture)
    engine.prepare_graphs()
    assert engine.capture_reports[-1].passes == 1


def test_a_set_environment_does_not_reach_an_explicit_config(monkeypatch, make_engine):
    monkeypatch.setenv("HARNESS_SKIP_WARMUP_PASS", "1")
    engine = make_engine(single_pass_capture=False)
    assert EngineConfig().single_pass_capture is None  # the variable is not read when a config is built
    engine.prepare_graphs()
    assert engine.capture_reports[-1].passes == 2


class ForcedRegrowth:
    """Regrows the model's workspace in the first eager forward after a capture (the second shape's
    warmup forward, in a single pass), as a smaller shape needing more scratch would. On CUDA a
    tensor of the old size then takes the freed address (the canary); a graph that still uses it
    writes into the canary."""

    def __init__(self, engine, monkeypatch) -> None:
        self.engine = engine
        self.eager_calls = 0
        self.captured = False
        self.canary: torch.Tensor | None = None
        graphs = engine.decode_graphs
        if graphs.step is not None:
            # The compiled path: the decode graphs warm up and capture the compiled step, which reads
            # its scratch from the same workspace but never calls the model's forward.
            self._forward = graphs.step
            monkeypatch.setattr(graphs, "step", self)
        else:
            self._forward = engine.model.forward
            monkeypatch.setattr(engine.model, "forward", self)  # undone after the test: the model is shared

    def __call__(self, *args):
        if self.engine.backend.is_capturing():
            self.captured = True
        else:
            self.eager_calls += 1
            if self.captured and self.canary is None:
                workspace = self.engine.model.workspace
                old = workspace.capacity
                workspace.get(2 * old)
                self.canary = torch.full((old,), 3.0, dtype=workspace.dtype, device=workspace.device)
        return self._forward(*args)

    def canary_clobbered(self) -> bool:
        return bool((self.canary != 3.0).any())


def _capture_with_forced_regrowth(engine, monkeypatch) -> ForcedRegrowth:
    engine.decode_graphs.warmup_and_capture("estimate")
    engine.decode_graphs.release()
    regrowth = ForcedRegrowth(engine, monkeypatch)
    engine.finalize_kv_cache()
    return regrowth


def test_a_moved_workspace_discards_the_single_pass_and_falls_back(make_engine, two_pass_run,
                                                                    decode_requests, eager_decode, caplog,
                                                                    monkeypatch):
    baseline_engine, baseline = two_pass_run
    engine = make_engine(single_pass_capture=True)
    with caplog.at_level(logging.WARNING, logger="harness.runtime.decode.decoder_graphs"):
        regrowth = _capture_with_forced_regrowth(engine, monkeypatch)
    assert regrowth.canary is not None and engine.model.workspace.growths >= 1
    report = engine.capture_reports[-1]
    assert report.fell_back, (f"tensors moved after their single-pass capture ({list(report.moved)}) "
                              f"but the single-pass graphs were kept: no fallback to two passes")
    assert report.single_pass_tried and report.passes == 3, report
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


@dataclass(frozen=True)
class NothingMoved(RankAgreement):
    """Planted bug: the ranks agree that nothing moved, whatever moved."""

    def moved(self, comm, moved) -> bool:
        return False


def test_without_the_fallback_the_stale_graph_fails(make_engine, decode_requests, eager_decode, monkeypatch):
    # The torch decode path attends through the workspace; the Triton kernel (CUDA's default)
    # reads the paged cache directly, so a stale workspace would leave nothing to see.
    engine = make_engine(single_pass_capture=True, decode_kernel="torch",
                         capture_policy=CapturePolicy(agreement=NothingMoved()))
    regrowth = _capture_with_forced_regrowth(engine, monkeypatch)
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
