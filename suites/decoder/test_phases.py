"""f. KV-cache estimation (phase 1) and the final KV cache (phase 2): release, recapture, agree."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness.check import compare_generations
from harness.graphs import FreedMemoryError
from harness.runtime.decode.policy import CapturePolicy


@dataclass(frozen=True)
class NoRecapture(CapturePolicy):
    """Planted bug: phase 2 reallocates the KV cache without a recapture (phase 1's graphs stay)."""

    def recaptures_for_final_cache(self) -> bool:
        return False


def test_phase_two_recaptures_against_the_final_kv_cache(make_engine, decode_requests, eager_decode,
                                                         overlap):
    engine = make_engine(single_pass_capture=True, overlap=overlap)
    num_blocks = engine.estimate_kv_cache()
    assert engine.capture_reports[-1].phase == "estimate" and engine.capture_reports[-1].passes == 2
    kept = engine.decode_graphs.runner.keys
    assert not kept, (f"phase 1's decode graphs were not released: {list(map(str, kept))} stay "
                      f"captured against the first KV cache")
    first_cache = engine.kv_cache
    engine.finalize_kv_cache(num_blocks + 8)
    assert engine.kv_cache is not first_cache and engine.kv_cache.num_blocks == num_blocks + 8
    # Every graph of phase 2 baked in the final cache and metadata.
    runner = engine.decode_graphs.runner
    assert len(runner) == 4 and runner.moved_tensors() == []
    records = runner.records(runner.keys[0])
    assert records["kv_cache.tensor"].address == engine.kv_cache.tensor.data_ptr()
    generations = engine.generate(decode_requests)
    comparison = compare_generations(eager_decode, generations)
    assert comparison.ok, str(comparison)
    assert engine.stats.captures["decode[bs=8,greedy]"] == 2


def test_skipping_the_recapture_diverges(make_engine, decode_requests, eager_decode):
    engine = make_engine(capture_policy=NoRecapture())
    engine.estimate_kv_cache()
    # The first cache and metadata stay alive: on CUDA, graphs reading freed metadata would take
    # garbage indices and trip a device-side assert that poisons the whole process.
    first = (engine.kv_cache, engine.metadata)
    engine.finalize_kv_cache()
    assert len(engine.decode_graphs.runner) == 4 and engine.kv_cache is not first[0]  # phase 1's graphs
    generations = engine.generate(decode_requests)
    comparison = compare_generations(eager_decode, generations)
    assert not comparison.ok
    assert comparison.divergences[0].step >= 1  # the eager prefill agreed; the stale graphs did not


def test_skipping_the_recapture_reads_freed_memory_on_the_emulator(make_engine, decode_requests):
    engine = make_engine(capture_policy=NoRecapture())
    if engine.backend.name != "emulated":
        pytest.skip("on CUDA the stale graphs read freed metadata: garbage indices trip a "
                    "device-side assert that poisons the process; the emulator names the freed tensor")
    engine.prepare_graphs()
    with pytest.raises(FreedMemoryError, match="freed"):
        engine.generate(decode_requests)


def test_strict_mode_names_the_reallocated_cache_when_the_recapture_is_skipped(make_engine, decode_requests):
    engine = make_engine(strict_graph_buffers=True, capture_policy=NoRecapture())
    engine.prepare_graphs()
    with pytest.raises(RuntimeError, match=r"kv_cache\.tensor: data pointer changed from 0x[0-9a-f]+ to 0x"):
        engine.generate(decode_requests)
