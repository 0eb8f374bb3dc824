"""a. Two-pass decode graphs against eager, and decode batches no graph fits."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fixtures.models import TINY_ENGINE_CONFIG
from harness.check import compare_generations
from harness.records import EAGER
from harness.runtime import Engine
from harness.runtime.engine import eager_compile_reason
from harness.runtime.decode.runner import DecodeGraphKey
from suites.decoder.conftest import SIZES


def test_two_pass_generation_matches_eager_and_replays_every_key(two_pass_run, eager_decode):
    engine, generations = two_pass_run
    comparison = compare_generations(eager_decode, generations)
    assert comparison.ok, str(comparison)
    stats = engine.stats
    keys = {str(DecodeGraphKey.of(size)) for size in SIZES}
    assert set(stats.captures) == keys
    assert {key: stats.replays.get(key, 0) >= 1 for key in keys} == dict.fromkeys(keys, True)
    assert dict(stats.capture_passes) == {"estimate": 2, "serve": 2}
    assert not stats.fallbacks
    # The prefill ran eagerly; every decode step named the graph that produced it.
    producers = [{s.producer for s in g.steps[1:]} for g in generations]
    assert all(g.steps[0].producer == EAGER for g in generations)
    assert set().union(*producers) == keys
    assert sum(stats.replays.values()) == sum(b.kind == "decode" for b in stats.batches)


def test_a_step_records_the_smallest_graph_that_fits(two_pass_run):
    engine, _ = two_pass_run
    for batch in engine.stats.batches:
        if batch.kind == "decode":
            fitting = min(s for s in SIZES if s >= batch.num_seqs)
            assert batch.producer == str(DecodeGraphKey.of(fitting))


def test_a_decode_batch_larger_than_every_graph_runs_eagerly_and_is_counted(make_engine, decode_requests,
                                                                            eager_decode, overlap):
    engine = make_engine(decode_graph_sizes=(2, 1), overlap=overlap)
    generations = engine.generate(decode_requests)
    comparison = compare_generations(eager_decode, generations)
    assert comparison.ok, str(comparison)
    large = [b.num_seqs for b in engine.stats.batches if b.kind == "decode" and b.num_seqs > 2]
    assert large
    assert all(b.producer == EAGER for b in engine.stats.batches if b.kind == "decode" and b.num_seqs > 2)
    expected = {f"decode batch of {n} exceeds the largest decode graph (2)": large.count(n) for n in set(large)}
    assert dict(engine.stats.fallbacks) == expected
    # On the compiled path each eager size is compiled once, at its first batch: counted apart from
    # the fallbacks, which are the batches' own.
    compiled = {eager_compile_reason(n, n): 1 for n in set(large)} if engine.compiled_step else {}
    assert dict(engine.stats.eager_compiles) == compiled


def test_graph_sizes_over_max_batch_size_are_refused(make_engine):
    with pytest.raises(ValueError, match=r"decode_graph_sizes \[16\] exceed max_batch_size 8"):
        make_engine(decode_graph_sizes=(16, 4))


def test_blocks_of_one_token_still_build_the_dummy_batches(make_engine, device_reference_llama,
                                                           decode_requests):
    requests = decode_requests[:4]
    eager = Engine(device_reference_llama, replace(TINY_ENGINE_CONFIG, block_size=1)).generate(requests)
    engine = make_engine(block_size=1, decode_graph_sizes=(4, 1))
    comparison = compare_generations(eager, engine.generate(requests))
    assert comparison.ok, str(comparison)
    assert engine.capture_reports[-1].keys == ("decode[bs=1,greedy]", "decode[bs=4,greedy]")
