"""f. KV-cache estimation (phase 1) and the final KV cache (phase 2): release, recapture, agree."""

from __future__ import annotations

import pytest

from harness.check import compare_generations
from harness.graphs import FreedMemoryError
from harness.runtime import Engine
from harness.runtime.decode.graphs import DecoderGraphs


def test_phase_two_recaptures_against_the_final_kv_cache(make_engine, decode_requests, eager_decode):
    engine = make_engine(single_pass_capture=True)
    num_blocks = engine.estimate_kv_cache()
    assert engine.capture_reports[-1].phase == "estimate" and engine.capture_reports[-1].passes == 2
    assert len(engine.decode_graphs.runner) == 0  # releasing phase 1 cleared every graph
    first_cache = engine.kv_cache
    engine.finalize_kv_cache(num_blocks + 8)
    assert engine.kv_cache is not first_cache and engine.kv_cache.num_blocks == num_blocks + 8
    # Every graph of phase 2 baked in the final cache and metadata.
    runner = engine.decode_graphs.runner
    assert len(runner) == 4 and runner.moved_tensors() == []
    records = runner._entries[runner.keys[0]].records
    assert records["kv_cache.tensor"].address == engine.kv_cache.tensor.data_ptr()
    generations = engine.generate(decode_requests)
    comparison = compare_generations(eager_decode, generations)
    assert comparison.ok, str(comparison)
    assert engine.stats.captures["decode[bs=8,greedy]"] == 2


def _skip_the_recapture(monkeypatch, keep_first_cache: bool) -> list:
    """Plant "phase 2 reallocates the KV cache without a recapture"; with `keep_first_cache` the
    first cache and metadata stay referenced, so the stale graphs read live (stale) memory."""
    monkeypatch.setattr(DecoderGraphs, "release", lambda self: None)
    monkeypatch.setattr(Engine, "_recapture_for_final_cache", lambda self: None)
    kept: list = []
    if keep_first_cache:
        allocate = Engine._allocate_kv_cache

        def keeping(self, num_blocks):
            if hasattr(self, "kv_cache"):
                kept.append((self.kv_cache, self.metadata))
            allocate(self, num_blocks)

        monkeypatch.setattr(Engine, "_allocate_kv_cache", keeping)
    return kept


def test_skipping_the_recapture_diverges(make_engine, decode_requests, eager_decode, monkeypatch):
    # The first cache and metadata stay alive: on CUDA, graphs reading freed metadata would take
    # garbage indices and trip a device-side assert that poisons the whole process.
    kept = _skip_the_recapture(monkeypatch, keep_first_cache=True)
    engine = make_engine()
    engine.prepare_graphs()
    assert len(engine.decode_graphs.runner) == 4 and kept  # phase 1's graphs, on the first cache
    generations = engine.generate(decode_requests)
    comparison = compare_generations(eager_decode, generations)
    assert not comparison.ok
    assert comparison.divergences[0].step >= 1  # the eager prefill agreed; the stale graphs did not


def test_skipping_the_recapture_reads_freed_memory_on_the_emulator(make_engine, decode_requests,
                                                                    monkeypatch):
    engine = make_engine()
    if engine.backend.name != "emulated":
        pytest.skip("on CUDA the stale graphs read freed metadata: garbage indices trip a "
                    "device-side assert that poisons the process; the emulator names the freed tensor")
    _skip_the_recapture(monkeypatch, keep_first_cache=False)
    engine.prepare_graphs()
    with pytest.raises(FreedMemoryError, match="freed"):
        engine.generate(decode_requests)


def test_strict_mode_names_the_reallocated_cache_when_the_recapture_is_skipped(make_engine, monkeypatch,
                                                                              decode_requests):
    monkeypatch.setattr(DecoderGraphs, "release", lambda self: None)
    monkeypatch.setattr(Engine, "_recapture_for_final_cache", lambda self: None)
    engine = make_engine(strict_graph_buffers=True)
    engine.prepare_graphs()
    with pytest.raises(RuntimeError, match=r"kv_cache\.tensor: data pointer changed from 0x[0-9a-f]+ to 0x"):
        engine.generate(decode_requests)
