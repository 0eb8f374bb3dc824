"""Suite a: prefill and mixed batches through piecewise graphs agree with eager, and every bucket
that served a batch was captured and replayed."""

from __future__ import annotations

import pytest
import torch

from harness.check import compare_generations
from harness.ops import SequenceSpan
from harness.runtime.piecewise.model import bucket_key
from suites.piecewise.conftest import BUCKETS


def producers(generations) -> list[str]:
    return [step.producer for g in generations for step in g.steps]


def assert_buckets_captured_and_replayed(engine) -> None:
    stats = engine.stats
    used = {b.producer for b in stats.batches if b.producer.startswith("piecewise[")}
    assert used, "no batch went through the piecewise graphs"
    for key in used:
        # Once against the estimation phase's KV cache, once against the final one.
        assert stats.captures.get(key) == 2, f"{key} served a batch but was captured {stats.captures.get(key)} times"
        batches = sum(b.producer == key for b in stats.batches)
        assert stats.replays.get(key) == batches, f"{key}: {stats.replays.get(key)} replays for {batches} batches"
    assert set(stats.captures) == {bucket_key(b) for b in engine.piecewise.buckets}
    for runner in engine.piecewise.compile_backend.runners:
        assert runner.captured_buckets == engine.piecewise.buckets
    assert engine.piecewise.compiles == 1 and engine.piecewise.recompiles == 0
    assert not [r for r in stats.fallbacks if r.startswith("piecewise")], dict(stats.fallbacks)


@pytest.mark.parametrize("max_batch_size", [8, 3], ids=["prefill", "prefill+mixed"])
def test_eight_prompts_through_piecewise_graphs_agree_with_eager(piecewise_engine, eager_run,
                                                                  grounding_requests, max_batch_size,
                                                                  overlap):
    engine = piecewise_engine(max_batch_size=max_batch_size, overlap=overlap)
    generations = engine.generate(grounding_requests)
    comparison = compare_generations(eager_run(grounding_requests, max_batch_size=max_batch_size), generations)
    assert comparison.ok, str(comparison)
    kinds = {b.kind for b in engine.stats.batches if b.producer.startswith("piecewise[")}
    assert kinds == ({"prefill"} if max_batch_size == 8 else {"prefill", "mixed"})
    assert_buckets_captured_and_replayed(engine)


def test_each_bucket_serves_the_batches_it_holds(piecewise_engine, eager_run):
    from fixtures.models import mixed_requests

    engine = piecewise_engine()
    for lens, bucket in (((3, 5), 16), ((16,), 16), ((9, 8), 64), ((40, 24), 64), ((40, 40, 40), 256)):
        requests = mixed_requests(seed=len(lens), prompt_lens=lens, max_new_tokens=[2] * len(lens))
        generations = engine.generate(requests)
        assert generations[0].steps[0].producer == bucket_key(bucket)
        assert compare_generations(eager_run(requests), generations).ok
    assert_buckets_captured_and_replayed(engine)


@pytest.fixture(scope="module")
def direct_engine(device_reference_llama, graph_backend):
    """One engine for the tests that prepare and run batches by hand (and free their blocks)."""
    from dataclasses import replace

    from fixtures.models import TINY_ENGINE_CONFIG
    from harness.runtime import Engine

    engine = Engine(device_reference_llama, replace(TINY_ENGINE_CONFIG, piecewise_buckets=BUCKETS),
                    backend=graph_backend)
    yield engine


@pytest.fixture
def engine(direct_engine):
    allocator = direct_engine.kv_cache.allocator
    free = allocator.num_free
    yield direct_engine
    allocator.free(list(allocator._used))
    assert allocator.num_free == free


def test_padded_tokens_write_only_the_pad_sink(engine):
    """A prefill of 5 tokens padded to 16: the 11 padded rows write nowhere but the pad block."""
    cache = engine.kv_cache
    cache.tensor.fill_(7.0)
    blocks = cache.allocator.allocate(1)
    prepare(engine, _batch([5, 1, 2, 3, 4], blocks), num_tokens=16)
    engine.piecewise.run(1, 16)
    written = (cache.tensor != 7.0).flatten(4).any(-1)  # [layers, 2, blocks + 1, block_size]
    assert written[:, :, blocks[0], :5].all() and not written[:, :, blocks[0], 5:].any()
    others = [b for b in range(cache.num_blocks) if b != blocks[0]]
    assert not written[:, :, others].any()
    assert written[:, :, cache.pad_block, 0].all()  # every padded row lands on the pad slot


def test_poisoned_padding_does_not_reach_real_rows(engine):
    """Padded rows write their K/V to the pad sink; NaN there leaves the real logits finite and
    unchanged."""
    blocks = engine.kv_cache.allocator.allocate(1)
    batch = _batch([11, 12, 13], blocks)
    prepare(engine, batch, num_tokens=16)
    clean = engine.piecewise.run(1, 16).clone()
    engine.kv_cache.tensor[:, :, engine.kv_cache.pad_block].fill_(float("nan"))
    prepare(engine, batch, num_tokens=16)
    poisoned = engine.piecewise.run(1, 16)
    assert torch.isfinite(poisoned).all() and torch.equal(clean, poisoned)


def prepare(engine, batch, **padding) -> None:
    """The batch copied into the engine's buffers, padded as `padding` says (the public seam)."""
    engine.prepare_padded(batch.spans, input_ids=batch.input_ids, **padding)


def _batch(tokens, blocks):
    from harness.runtime.scheduler import ScheduledBatch

    span = SequenceSpan(seq_len=len(tokens), query_len=len(tokens), block_table=tuple(blocks))
    return ScheduledBatch(sequences=(object(),), num_prefills=1, spans=(span,), input_ids=tuple(tokens))


def test_the_bucket_must_match_the_prepared_batch(engine):
    prepare(engine, _batch([1, 2, 3], engine.kv_cache.allocator.allocate(1)), num_tokens=16)
    with pytest.raises(ValueError, match="metadata holds 16 token rows, the bucket is 64"):
        engine.piecewise.run(1, 64)
    with pytest.raises(ValueError, match=r"tokens=32 is not a piecewise bucket; buckets are \[16, 64, 256\]"):
        engine.piecewise.run(1, 32)


def test_an_engine_refuses_a_bad_bucket_naming_it(engine_factory):
    with pytest.raises(ValueError, match="piecewise bucket 512 exceeds max_num_tokens 256"):
        engine_factory(piecewise_buckets=(16, 512))
    with pytest.raises(ValueError, match="piecewise bucket 1 is below the minimum 2"):
        engine_factory(piecewise_buckets=(1, 16))


def test_default_buckets_serve_everything(piecewise_engine, eager_run, grounding_requests):
    from harness.runtime.piecewise.buckets import default_buckets

    engine = piecewise_engine(buckets=default_buckets(64), max_num_tokens=64)
    assert engine.piecewise.buckets == (2, 4, 8, 16, 32, 64)
    generations = engine.generate(grounding_requests)
    assert compare_generations(eager_run(grounding_requests, max_num_tokens=64), generations).ok
    assert_buckets_captured_and_replayed(engine)


def test_a_recompile_while_serving_is_counted(piecewise_engine, eager_run):
    """Planted: a bucket of one token row slips past validation. dynamo specializes size 1, so
    serving it compiles a second graph without captures: counted as a recompile, its pieces run
    eagerly and are counted, and the tokens still agree."""
    from fixtures.models import mixed_requests

    engine = piecewise_engine(buckets=(16,))
    engine.piecewise.buckets = (1, 16)
    requests = mixed_requests(prompt_lens=(1,), max_new_tokens=(1,))
    assert compare_generations(eager_run(requests), engine.generate(requests)).ok
    assert engine.piecewise.compiles == 2 and engine.piecewise.recompiles == 1
    fallbacks = engine.stats.fallbacks
    assert fallbacks["piecewise recompile while serving tokens=1"] == 1
    assert sum(n for r, n in fallbacks.items() if "no graph for tokens=1" in r) == 3


def test_a_forward_that_bypasses_the_graphs_is_counted(piecewise_engine, eager_run):
    """Planted: the body runs uncompiled (as dynamo does past its recompile limit), so no runner
    is called; the forward is counted rather than passed off as a replay."""
    from fixtures.models import mixed_requests
    from harness.runtime.piecewise.model import make_token_body

    engine = piecewise_engine(buckets=(16,))
    engine.piecewise._compiled = make_token_body(engine.model)
    requests = mixed_requests(prompt_lens=(4, 5), max_new_tokens=(1, 1))
    assert compare_generations(eager_run(requests), engine.generate(requests)).ok
    assert engine.stats.fallbacks["piecewise graphs bypassed at tokens=16: 0 of 3 segments ran"] == 1


def test_only_the_graphs_boundary_inputs_are_copied(piecewise_engine, eager_run):
    """A segment after the first reads the earlier segments' static outputs where they are (hidden
    states, attention output, rotary rows): no copy into a static buffer of its own."""
    from fixtures.models import mixed_requests
    from harness.check.compare import compare_generations

    engine = piecewise_engine()
    runners = engine.piecewise.compile_backend.live_runners
    for bucket in engine.piecewise.buckets:
        first, *later = sorted(runners, key=lambda r: r.index)
        assert first.entries[bucket].copied, "the boundary inputs (token ids, metadata) are copied"
        assert [r.entries[bucket].copied for r in later] == [()] * len(later)
    requests = mixed_requests(logprobs=2, max_new_tokens=(3,) * 8)
    comparison = compare_generations(eager_run(requests), engine.generate(requests))
    assert comparison.ok, str(comparison)
