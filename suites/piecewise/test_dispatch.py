"""Suite d: dual-mode routing, asserted from the engine's stats. Prefill and mixed batches take the
smallest bucket that holds them; batches above the largest bucket and decode batches without decode
graphs run eagerly, each counted with its reason."""

from __future__ import annotations


import pytest

from fixtures.models import mixed_requests
from harness.check import compare_generations
from harness.runtime.piecewise.model import bucket_key



def routed(engine) -> list[tuple[str, int, str]]:
    return [(b.kind, b.num_tokens, b.producer) for b in engine.stats.batches]


def test_prefill_only_batches_take_the_smallest_bucket(piecewise_engine, eager_run):
    engine = piecewise_engine(buckets=(16, 32, 64))
    requests = mixed_requests(prompt_lens=(7, 10), max_new_tokens=(1, 1))  # 17 tokens
    generations = engine.generate(requests)
    assert routed(engine) == [("prefill", 17, bucket_key(32))]
    assert engine.stats.replays == {bucket_key(32): 1}
    assert dict(engine.stats.fallbacks) == {}
    assert [g.steps[0].producer for g in generations] == [bucket_key(32)] * 2
    assert compare_generations(eager_run(requests), generations).ok


def test_mixed_batches_take_a_bucket_and_decodes_run_eagerly_by_request(piecewise_engine, eager_run):
    engine = piecewise_engine(buckets=(16, 32, 64), max_batch_size=2)
    requests = mixed_requests(prompt_lens=(5, 6, 20), max_new_tokens=(1, 3, 2))
    generations = engine.generate(requests)
    # Step 1 prefills 5 + 6 tokens; request 0 is then done, so step 2 decodes request 1 and admits
    # the 20-token prompt (mixed, 21 tokens); the steps after it are decodes.
    batches = routed(engine)
    assert batches[0] == ("prefill", 11, bucket_key(16))
    assert batches[1] == ("mixed", 21, bucket_key(32))
    decodes = [b for b in batches if b[0] == "decode"]
    assert decodes and all(producer == "eager" for _, _, producer in decodes)
    # No decode graphs were asked for: eager decodes are the configuration, not a fallback.
    assert engine.stats.fallbacks == {}
    assert compare_generations(eager_run(requests, max_batch_size=2), generations).ok


def test_a_batch_above_the_largest_bucket_runs_eagerly_with_its_reason(piecewise_engine, eager_run):
    engine = piecewise_engine(buckets=(8, 16))
    requests = mixed_requests(prompt_lens=(12, 9), max_new_tokens=(1, 1))  # 21 tokens
    generations = engine.generate(requests)
    assert routed(engine) == [("prefill", 21, "eager")]
    assert engine.stats.fallbacks == {"prefill batch of 21 tokens: above the largest piecewise bucket 16": 1}
    assert engine.stats.replays == {}
    assert compare_generations(eager_run(requests), generations).ok


def test_an_engine_without_graph_options_counts_no_fallbacks(engine_factory):
    engine = engine_factory()
    engine.generate(mixed_requests(prompt_lens=(3, 4), max_new_tokens=(3, 3)))
    assert engine.stats.fallbacks == {} and engine.piecewise is None and engine.stats.graph_steps == 0


def test_decode_only_batches_replay_decode_graphs_and_prefills_piecewise(piecewise_engine, eager_run,
                                                                         grounding_requests, overlap):
    """Decode batches of every size up to max_batch_size replay a decode graph, prefill and mixed
    batches a piecewise bucket, nothing runs eagerly."""
    engine = piecewise_engine(max_batch_size=3, decode_graph_sizes=(1, 3), overlap=overlap)
    generations = engine.generate(grounding_requests)
    for kind, _, producer in routed(engine):
        if kind == "decode":
            assert producer != "eager" and not producer.startswith("piecewise[")
        else:
            assert producer.startswith("piecewise[")
    assert engine.stats.fallbacks == {}
    assert compare_generations(eager_run(grounding_requests, max_batch_size=3), generations).ok
