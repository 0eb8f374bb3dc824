"""Sampling variants: decode graphs that rank top-k logprobs on the device (`graph_top_k`).

Each size has one graph per k (key variant f"top{k}"); a decode batch replays the smallest k that
covers its largest requested `logprobs`. Two request sets between them replay every (size, k):
in LONGEST_WANTS_FOUR the longest request asks for 4 logprobs, so every decode batch, down to 1,
needs top4; in SHORTEST_WANTS_FOUR the shortest does, so once it finishes every batch, down to 1,
needs only top2. The planted bug (a key that ignores the variant) hands a request asking for 4
logprobs a graph that ranked 2, which the comparison reports as a "top" divergence.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fixtures.models import TINY_ENGINE_CONFIG, mixed_requests
from harness.check import compare_generations
from harness.records import EAGER
from harness.runtime import Engine, EngineConfig
from harness.runtime.decode.decoder_graphs import DecoderGraphs
from harness.runtime.decode.runner import DecodeGraphKey, sampling_variant
from suites.decoder.conftest import MAX_NEW_TOKENS, SIZES

TOP_KS = (2, 4)
# MAX_NEW_TOKENS: request 5 is the longest, request 0 the shortest.
LONGEST_WANTS_FOUR = (0, 2, 0, 2, 0, 4, 2, 0)
SHORTEST_WANTS_FOUR = (4, 2, 0, 2, 0, 2, 0, 2)
ALL_KEYS = {str(DecodeGraphKey.of(size, sampling_variant(k))) for size in SIZES for k in TOP_KS}


def requests_with_logprobs(logprobs: tuple[int, ...]):
    return [replace(r, logprobs=k)
            for r, k in zip(mixed_requests(max_new_tokens=MAX_NEW_TOKENS), logprobs, strict=True)]


def judgeable(pattern: tuple[int, ...], compiled_path: bool) -> tuple[int, ...]:
    """`pattern` as the comparison can judge it. The compiled step rounds apart from the eager ops,
    so a near-tie token can flip; a request asking for fewer than 2 logprobs records no runner-up
    to allow the flip by, and asks for 2 on the compiled path. The variant each batch replays is
    unchanged: 0, 1 and 2 all replay top2."""
    return tuple(max(k, 2) for k in pattern) if compiled_path else pattern


@pytest.fixture(scope="module")
def eager_runs(device_reference_llama, compiled_path):
    """{logprobs pattern: (requests, eager generations)}."""
    runs = {}
    for pattern in (LONGEST_WANTS_FOUR, SHORTEST_WANTS_FOUR):
        requests = requests_with_logprobs(judgeable(pattern, compiled_path))
        runs[pattern] = requests, Engine(device_reference_llama, TINY_ENGINE_CONFIG).generate(requests)
    return runs


def compare_top_k_graphs_with_eager(make_engine, eager_runs, pattern=LONGEST_WANTS_FOUR):
    """(engine, comparison) of an engine with graph_top_k=TOP_KS against eager on `pattern`'s
    requests. The fault zoo's detector for "the graph key ignores the sampling variant"."""
    requests, eager = eager_runs[pattern]
    engine = make_engine(graph_top_k=TOP_KS)
    return engine, compare_generations(eager, engine.generate(requests))


def key_ignoring_the_sampling_variant(graphs: DecoderGraphs, batch_size: int, top_k: int | None):
    """The planted bug, a stand-in for `DecoderGraphs.graph_key`: every key gets the smallest k."""
    return DecodeGraphKey.of(batch_size, sampling_variant(min(graphs.top_ks)))


def test_mixed_logprobs_match_eager_and_replay_every_key(make_engine, eager_runs, overlap):
    engine = make_engine(graph_top_k=TOP_KS, overlap=overlap)
    decode_producers = set()
    for pattern, (requests, eager) in eager_runs.items():
        generations = engine.generate(requests)
        comparison = compare_generations(eager, generations)
        assert comparison.ok, str(comparison)
        for request, generation in zip(requests, generations):
            assert all(len(s.top) == request.logprobs for s in generation.steps)
            assert generation.steps[0].producer == EAGER  # the prefill
            decode_producers |= {s.producer for s in generation.steps[1:]}
        if pattern == LONGEST_WANTS_FOUR:
            assert {s.producer.endswith(",top4]") for g in generations for s in g.steps[1:]} == {True}
    stats = engine.stats
    assert set(stats.captures) == ALL_KEYS
    assert {key: stats.replays.get(key, 0) >= 1 for key in ALL_KEYS} == dict.fromkeys(ALL_KEYS, True)
    # Every producer names its variant. With overlap a finished row rides along for one more step,
    # so the smallest graphs may serve only extra steps, whose tokens are dropped.
    assert decode_producers == ALL_KEYS or (overlap and decode_producers < ALL_KEYS)
    assert not stats.fallbacks


def test_graph_key_includes_the_sampling_variant(make_engine, eager_runs):
    engine, comparison = compare_top_k_graphs_with_eager(make_engine, eager_runs)
    assert comparison.ok, str(comparison)
    assert any(key.endswith(",top4]") for key in engine.stats.replays)


def test_a_key_that_ignores_the_sampling_variant_fails_the_comparison(make_engine, eager_runs, monkeypatch):
    fired = []

    def planted(graphs, batch_size, top_k):
        fired.append(top_k)
        return key_ignoring_the_sampling_variant(graphs, batch_size, top_k)

    monkeypatch.setattr(DecoderGraphs, "graph_key", planted)
    engine, comparison = compare_top_k_graphs_with_eager(make_engine, eager_runs)
    assert 4 in fired
    assert not comparison.ok
    (divergence,) = comparison.divergences  # request 5, the one asking for 4 logprobs
    assert (divergence.request, divergence.step, divergence.kind) == (5, 1, "top")
    assert divergence.producer == "decode[bs=8,top2]"
    assert "the top-k list has 2 entries, the baseline's 4" in str(comparison)
    assert set(engine.stats.captures) == {str(DecodeGraphKey.of(s, "top2")) for s in SIZES}


def test_a_batch_wanting_more_than_every_k_runs_eagerly_and_is_counted(make_engine, eager_runs):
    requests, eager = eager_runs[SHORTEST_WANTS_FOUR]
    engine = make_engine(graph_top_k=(2,))
    comparison = compare_generations(eager, engine.generate(requests))
    assert comparison.ok, str(comparison)
    # Request 0 asks for 4 logprobs: every decode batch it is in (its 7 decode steps, all of 8
    # sequences) runs eagerly; once it is done the others replay top2 graphs.
    wide = [b for b in engine.stats.batches if b.kind == "decode" and b.producer == EAGER]
    assert [b.num_seqs for b in wide] == [8] * (MAX_NEW_TOKENS[0] - 1)
    assert dict(engine.stats.fallbacks) == {
        "decode batch of 8 wants top-4 logprobs, more than the largest graph_top_k (2)": len(wide)}
    assert set(engine.stats.replays) == {str(DecodeGraphKey.of(s, "top2")) for s in SIZES}


def test_graph_top_k_is_validated_deduplicated_and_sorted(make_engine):
    assert EngineConfig(graph_top_k=(4, 2, 4)).graph_top_k == (2, 4)
    with pytest.raises(ValueError, match=r"graph_top_k\[1\] must be an integer >= 1, got 0"):
        EngineConfig(graph_top_k=(4, 0))
    assert EngineConfig.from_dict(EngineConfig(graph_top_k=(3,)).to_dict()).graph_top_k == (3,)
    with pytest.raises(ValueError, match=r"graph_top_k \[2\] needs decode graphs"):
        make_engine(decode_graph_sizes=(), graph_top_k=(2,))
    with pytest.raises(ValueError, match=r"graph_top_k \[100000\] exceed the vocabulary size 512"):
        make_engine(graph_top_k=(2, 100000))


@pytest.mark.parametrize("top_k", [None, 2], ids=["greedy", "top2"])
def test_a_step_held_past_the_next_replay_keeps_its_values(make_engine, top_k):
    """A graph's outputs are static: the next replay overwrites them. What a step hands out, logits
    or the ranking a top-k graph made, must be a copy that a caller can hold past the next replay."""
    from harness.ops.metadata import SequenceSpan

    engine = make_engine(decode_graph_sizes=(2,), graph_top_k=(top_k,) if top_k else ())
    engine.prepare_graphs()
    bs = engine.kv_cache.block_size
    spans = tuple(SequenceSpan(seq_len=3, query_len=1, block_table=tuple(engine.kv_cache.allocator.allocate(1)))
                  for _ in range(2))
    held = engine.decode_graphs.run(spans, (5, 6), [top_k or 1] * 2)
    assert held is not None and bs >= 3
    values = held.logits if top_k is None else held.packed.values
    before = values.clone()
    engine.decode_graphs.run(spans, (7, 8), [top_k or 1] * 2)  # other tokens: other logits
    engine.backend.synchronize()
    assert torch.equal(values, before), (
        f"the {held.key} step's {'logits' if top_k is None else 'ranking'} changed under the holder "
        f"after the next replay: the graph's static output was handed out uncopied")


@pytest.mark.parametrize("greedy_ranking", ["separate", "fused"])
def test_top1_graphs_rank_as_eager_with_either_greedy_ranking(make_engine, device_reference_llama,
                                                             compiled_path, overlap, greedy_ranking):
    """Requests wanting the greedy token alone replay top1 graphs, which rank with the engine's
    greedy ranking (on CUDA "fused" is harness::greedy_pack's Triton kernels): the same tokens as
    eager, logprobs within the comparison's tolerance."""
    if compiled_path:
        pytest.skip("the compiled step rounds apart from the eager ops, and a request with one "
                    "logprob records no runner-up to judge a near-tie flip by")
    requests = requests_with_logprobs((1,) * len(MAX_NEW_TOKENS))
    eager = Engine(device_reference_llama, TINY_ENGINE_CONFIG).generate(requests)
    engine = make_engine(graph_top_k=(1,), overlap=overlap, greedy_ranking=greedy_ranking)
    assert engine.greedy_ranking.mode == greedy_ranking
    comparison = compare_generations(eager, engine.generate(requests))
    assert comparison.ok, str(comparison)
    assert set(engine.stats.replays) == {str(DecodeGraphKey.of(s, "top1")) for s in SIZES}
