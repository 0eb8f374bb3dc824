"""Suite c: phase 1, clear, phase 2. After `clear()` every graph is released; the recapture records
into fresh pools and agrees with eager; a recapture into a released pool (planted) is caught."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.check import compare_generations
from harness.runtime.piecewise.policy import PiecewisePolicy
from harness.runtime.piecewise.runner import ReleasedPoolError, same_pool
from harness.runtime.piecewise.model import bucket_key
from fixtures.models import TINY_ENGINE_CONFIG
from harness.runtime import Engine
from harness.runtime.config import fill_unset
from suites.piecewise.conftest import BUCKETS, FirstPoolAgain


def pools(engine) -> list:
    return [group.pool for group in engine.piecewise.compile_backend.groups]


def test_phase_two_recaptures_into_fresh_pools_and_agrees_with_eager(device_reference_llama, graph_backend,
                                                                      eager_run, grounding_requests, overlap,
                                                                      engine_defaults):
    # The session's engine path (--engine-compile inductor: the pieces compiled by inductor).
    config = fill_unset(replace(TINY_ENGINE_CONFIG, piecewise_buckets=BUCKETS, max_batch_size=3,
                                overlap=overlap), engine_defaults)
    engine = Engine(device_reference_llama, config, backend=graph_backend)
    engine.estimate_kv_cache()  # phase 1: capture every bucket, then clear
    assert all(runner.entries == {} for runner in engine.piecewise.compile_backend.runners)
    released = pools(engine)
    engine.finalize_kv_cache()  # phase 2: a new KV cache, recaptured into fresh pools
    generations = engine.generate(grounding_requests)

    comparison = compare_generations(eager_run(grounding_requests, max_batch_size=3), generations)
    assert comparison.ok, str(comparison)
    assert not any(same_pool(new, old) for new in pools(engine) for old in released)
    stats = engine.stats
    assert all(stats.captures[bucket_key(b)] == 2 for b in BUCKETS)
    assert stats.capture_passes["piecewise"] == 2
    assert engine.piecewise.compiles == 1  # a recapture is not a recompile
    assert not [r for r in stats.fallbacks if r.startswith("piecewise")], dict(stats.fallbacks)


def test_serving_after_clear_without_recapture_is_a_counted_eager_run(piecewise_engine, eager_run):
    from fixtures.models import mixed_requests

    requests = mixed_requests(prompt_lens=(5, 9), max_new_tokens=(2, 2))
    engine = piecewise_engine()
    engine.piecewise.clear()
    generations = engine.generate(requests)
    assert compare_generations(eager_run(requests), generations).ok
    missing = {r: n for r, n in engine.stats.fallbacks.items() if "no graph for tokens=16" in r}
    # One count per static segment of the forward: the embedding piece, one between the two
    # layers' attention ops, and the last.
    assert sum(missing.values()) == len(engine.piecewise.compile_backend.runners) == 3


def test_a_recapture_into_a_released_pool_is_caught(device_reference_llama, graph_backend):
    """Planted bug: the fresh-pool factory returns the group's released pool. On CUDA the caching
    allocator may still hold that pool for a live allocation (an assertion on its use count, or
    silent sharing); the runner refuses the capture by pool identity on every backend."""
    config = replace(TINY_ENGINE_CONFIG, piecewise_buckets=BUCKETS)
    engine = Engine(device_reference_llama, config, backend=graph_backend,
                    piecewise_policy=PiecewisePolicy(pools=FirstPoolAgain()))
    engine.piecewise.capture()
    released = pools(engine)
    engine.piecewise.clear()
    assert any(same_pool(new, old) for new in pools(engine) for old in released)
    with pytest.raises(ReleasedPoolError, match=r"piecewise segment \d+: capture for tokens=\d+ would "
                                                r"record into pool"):
        engine.piecewise.capture()
