"""Piecewise prefill on the compiled path: each static piece an inductor-compiled piece, captured per
token bucket by its PiecewiseRunner (vLLM's piecewise graphs over inductor pieces), against eager.
Dynamo is asked at every prefill step here, so a guard that fails while serving shows as a
recompile, counted in the engine's fallbacks."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fixtures.models import TINY_ENGINE_CONFIG, mixed_requests
from harness.check import compare_generations
from harness.runtime import Engine
from harness.runtime.compiled.piece import CompiledPiece

BUCKETS = (32, 64)


@pytest.fixture(scope="module")
def prefill_requests():
    # Prefill batches of 22 and 45 tokens: buckets 32 and 64.
    return [*mixed_requests(seed=1, logprobs=2, prompt_lens=(3, 19), max_new_tokens=(2, 2)),
            *mixed_requests(seed=2, logprobs=2, prompt_lens=(40, 5), max_new_tokens=(2, 2))]


def _generate_in_two_batches(engine, requests):
    return engine.generate(requests[:2]) + engine.generate(requests[2:])


@pytest.fixture(scope="module")
def eager_prefill(device_reference_llama, prefill_requests):
    return _generate_in_two_batches(Engine(device_reference_llama, TINY_ENGINE_CONFIG), prefill_requests)


@pytest.fixture(scope="module")
def compiled_prefill_engine(device_reference_llama, graph_backend):
    config = replace(TINY_ENGINE_CONFIG, max_batch_size=4, piecewise_buckets=BUCKETS, compile="inductor")
    return Engine(device_reference_llama, config, backend=graph_backend)


def test_compiled_prefill_replays_every_bucket_without_recompiling(eager_prefill, prefill_requests,
                                                                    compiled_prefill_engine):
    engine = compiled_prefill_engine
    generations = _generate_in_two_batches(engine, prefill_requests)
    comparison = compare_generations(eager_prefill, generations)
    assert comparison.ok, str(comparison)
    piecewise_fallbacks = {r: n for r, n in engine.stats.fallbacks.items() if r.startswith("piecewise")}
    assert not piecewise_fallbacks, f"prefill ran outside its graphs: {piecewise_fallbacks}"
    assert {k for k, n in engine.stats.replays.items() if n} >= {f"piecewise[tokens={b}]" for b in BUCKETS}
    runners = engine.piecewise.compile_backend.live_runners
    assert runners and all(isinstance(r.module, CompiledPiece) for r in runners)
    assert all(len(r.module.compiled_shapes) == len(BUCKETS) for r in runners)
