"""The overlap loop (`EngineConfig(overlap=True)`) in eager mode: the generations of the loop
without overlap, exactly (the emulated and CPU backends are deterministic), one extra step at the
end whose tokens are dropped, and KV room reserved for it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fixtures.models import TINY_ENGINE_CONFIG, mixed_requests, step_values
from harness.records import Request
from harness.runtime import BadRequestError, Engine


@pytest.mark.parametrize("max_batch_size", [8, 3], ids=["all-admitted", "admitted-later"])
def test_overlap_gives_the_generations_of_the_loop_without_overlap(reference_llama, max_batch_size):
    requests = mixed_requests(logprobs=3)
    config = replace(TINY_ENGINE_CONFIG, max_batch_size=max_batch_size)
    expected = Engine(reference_llama, config).generate(requests)
    engine = Engine(reference_llama, replace(config, overlap=True))
    actual = engine.generate(requests)
    assert step_values(actual) == step_values(expected)
    assert [s.producer for g in actual for s in g.steps] == ["eager"] * sum(len(g.steps) for g in actual)
    assert engine.num_free_blocks == engine.kv_cache.allocator.num_blocks


def test_the_host_learns_of_a_finish_one_step_late(reference_llama):
    # One request: without overlap 4 steps (a prefill, 3 decodes); with it a fifth, whose token is
    # dropped, because it was launched before the host read the fourth.
    request = [Request(prompt=[1, 2, 3], max_new_tokens=4, logprobs=1)]
    plain = Engine(reference_llama, TINY_ENGINE_CONFIG)
    overlapped = Engine(reference_llama, replace(TINY_ENGINE_CONFIG, overlap=True))
    assert step_values(overlapped.generate(request)) == step_values(plain.generate(request))
    assert len(plain.stats.batches) == 4
    assert len(overlapped.stats.batches) == 5
    assert [b.kind for b in overlapped.stats.batches] == ["prefill"] + ["decode"] * 4
    # A batch is recorded at launch: the extra step was launched while the request still held its
    # blocks (the host had not read the step that finished it); without overlap they are back.
    total = plain.kv_cache.allocator.num_blocks
    assert plain.stats.batches[-1].free_blocks == total
    assert overlapped.stats.batches[-1].free_blocks < total
    assert overlapped.num_free_blocks == total


def test_the_extra_step_needs_kv_room(reference_llama):
    # 15 prompt tokens + 2 new store 16 K/V without overlap (one block of 16); the overlap's extra
    # step stores a 17th.
    config = replace(TINY_ENGINE_CONFIG, num_blocks=1, max_batch_size=1)
    request = Request(prompt=list(range(1, 16)), max_new_tokens=2, logprobs=0)
    assert len(Engine(reference_llama, config).generate([request])[0].steps) == 2
    with pytest.raises(BadRequestError, match="needs 2 KV blocks of 16 tokens, the cache has 1"):
        Engine(reference_llama, replace(config, overlap=True)).generate([request])


def test_a_token_fed_from_the_wrong_row_changes_the_generations(reference_llama, monkeypatch):
    """The comparison above can fail: feed each pending token from the previous step's rows in
    reverse order (a loop that lost track of where its sequences sat) and the texts differ."""
    from harness.runtime import overlap

    requests = mixed_requests(logprobs=1, prompt_lens=(3, 7, 12), max_new_tokens=(6, 6, 6))
    expected = Engine(reference_llama, TINY_ENGINE_CONFIG).generate(requests)
    feed = overlap.token_feed

    def reversed_feed(batch, previous):
        found = feed(batch, previous)
        return None if found is None else overlap.TokenFeed(found.tokens, found.rows, found.sources[::-1])

    monkeypatch.setattr(overlap, "token_feed", reversed_feed)
    actual = Engine(reference_llama, replace(TINY_ENGINE_CONFIG, overlap=True)).generate(requests)
    assert step_values(actual) != step_values(expected)
