"""The eager engine: batching, records, stats, KV blocks, bad requests, determinism."""

from __future__ import annotations

import math

import pytest
import torch

from fixtures.models import TINY_ENGINE_CONFIG, mixed_requests
from harness.check import compare_generations
from harness.runtime import BadRequestError, Engine, EngineConfig, Request
from harness.ranking import logits_to_steps


def test_every_step_is_recorded_eager_with_top_k(eager_generations, grounding_requests):
    for request, generation in zip(grounding_requests, eager_generations):
        assert len(generation.steps) == request.max_new_tokens
        for step in generation.steps:
            assert step.producer == "eager"
            assert len(step.top) == request.logprobs
            assert step.top[0] == (step.token, step.logprob)
            assert [lp for _, lp in step.top] == sorted((lp for _, lp in step.top), reverse=True)
            assert step.logprob <= 0 and 5 <= step.logit_scale <= 30


def test_logprobs_are_fp32_log_softmax_of_the_logits(engine_factory, reference_llama):
    """Recompute the first step by hand from a plain forward of the prompt."""
    prompt = [5, 17, 300, 42]
    generation = engine_factory().generate([Request(prompt, 1, logprobs=3)])[0]
    engine = engine_factory()
    from harness.ops import SequenceSpan

    engine.metadata.prepare([SequenceSpan(4, 4, engine.kv_cache.allocator.allocate(1))])
    logits = reference_llama(torch.tensor(prompt), engine.metadata, engine.kv_cache)[0]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    top = torch.topk(logits, 3).indices.tolist()
    step = generation.steps[0]
    assert [t for t, _ in step.top] == top
    assert step.logprob == pytest.approx(logprobs[top[0]].item(), abs=1e-6)
    assert step.logit_scale == pytest.approx(logits.abs().max().item())


def test_ties_go_to_the_lowest_token_id():
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    rows = logits_to_steps(logits, [3, 2], "eager")
    assert rows[0].token == 1 and [t for t, _ in rows[0].top] == [1, 3, 4]
    assert rows[1].token == 0 and [t for t, _ in rows[1].top] == [0, 1]
    assert rows[1].logprob == pytest.approx(-math.log(5))


def test_the_greedy_ranking_alone_picks_the_first_entry_of_a_wider_one():
    """A width of one takes another path (one reduction, not a selection): it must pick the
    token a wider ranking puts first, ties, signed zeros and infinities included."""
    from harness.ranking import rank_logits

    nan = torch.tensor(math.nan)
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0, 3.0], [-0.0, 0.0, -1.0, 0.0, -0.0],
                           [-math.inf, -math.inf, -5.0, -5.0, -math.inf],
                           [math.inf, 1.0, math.inf, 2.0, 0.0],
                           # a NaN with the sign bit set ranks last, one without it first
                           [1.0, -nan, nan, 2.0, nan], [-nan, -nan, -7.0, -nan, -7.0]])
    greedy, wider = rank_logits(logits, 1), rank_logits(logits, 3)
    assert greedy.order.shape == (6, 1)
    assert greedy.order[:, 0].tolist() == wider.order[:, 0].tolist() == [1, 0, 2, 0, 2, 2]
    torch.testing.assert_close(greedy.top_logprobs[:, 0], wider.top_logprobs[:, 0], rtol=0, atol=0,
                               equal_nan=True)  # a row holding +inf has NaN logprobs


def test_logprobs_zero_keeps_no_pairs(engine_factory):
    generation = engine_factory().generate([Request([1, 2, 3], 2, logprobs=0)])[0]
    assert all(step.top == () for step in generation.steps)


def test_decode_batches_shrink_as_requests_finish(engine_factory, grounding_requests):
    engine = engine_factory()
    engine.generate(grounding_requests)
    batches = engine.stats.batches
    assert batches[0].kind == "prefill" and batches[0].num_seqs == len(grounding_requests)
    assert batches[0].num_tokens == sum(len(r.prompt) for r in grounding_requests)
    # After step i (0-based) the requests with max_new_tokens > i + 1 are still decoding.
    expected = [sum(r.max_new_tokens > i for r in grounding_requests)
                for i in range(1, max(r.max_new_tokens for r in grounding_requests))]
    assert engine.stats.decode_batch_sizes() == expected
    assert expected[0] == 8 and expected[-1] == 2 and len(set(expected)) >= 6


def test_kv_blocks_are_freed_when_each_request_finishes(engine_factory, grounding_requests):
    engine = engine_factory()
    total = engine.num_free_blocks
    block = engine.config.block_size
    held = [math.ceil((len(r.prompt) + r.max_new_tokens - 1) / block) for r in grounding_requests]
    engine.generate(grounding_requests)
    free_after_step = [b.free_blocks for b in engine.stats.batches]
    expected = [total - sum(h for h, r in zip(held, grounding_requests) if r.max_new_tokens > i + 1)
                for i in range(len(free_after_step))]
    assert free_after_step == expected
    assert engine.num_free_blocks == total


def test_stats_count_eager_steps_and_no_graph_work(engine_factory, grounding_requests):
    engine = engine_factory()
    assert engine.stats.steps == 0
    engine.generate(grounding_requests)
    stats = engine.stats
    assert stats.eager_steps == max(r.max_new_tokens for r in grounding_requests) == len(stats.batches)
    assert stats.graph_steps == 0
    assert dict(stats.captures) == dict(stats.replays) == dict(stats.fallbacks) == {}
    engine.generate(grounding_requests[:1])
    assert stats.eager_steps == 16  # a snapshot does not change under its holder
    assert engine.stats.eager_steps == 16 + grounding_requests[0].max_new_tokens


def test_two_runs_are_identical(engine_factory, grounding_requests, eager_generations, overlap,
                                compiled_path):
    engine = engine_factory(overlap=overlap)
    first = engine.generate(grounding_requests)
    second = engine.generate(grounding_requests)  # same engine, reused cache blocks
    other = engine_factory(overlap=overlap).generate(grounding_requests)
    assert first == second == other
    if compiled_path:  # inductor's kernels round apart from the eager ops: equal within BF16 steps
        comparison = compare_generations(eager_generations, first)
        assert comparison.ok, str(comparison)
    else:
        assert first == eager_generations


def test_limits_on_batch_admit_later_requests_in_mixed_batches(engine_factory, grounding_requests,
                                                               eager_generations, overlap):
    engine = engine_factory(max_batch_size=3, max_num_tokens=64, overlap=overlap)
    generations = engine.generate(grounding_requests)
    kinds = [b.kind for b in engine.stats.batches]
    assert "mixed" in kinds and all(b.num_seqs <= 3 and b.num_tokens <= 64 for b in engine.stats.batches)
    comparison = compare_generations(eager_generations, generations)
    assert comparison.ok, str(comparison)


def test_few_kv_blocks_delay_admission_without_losing_requests(engine_factory, grounding_requests,
                                                                 eager_generations, overlap):
    engine = engine_factory(num_blocks=5, overlap=overlap)
    generations = engine.generate(grounding_requests)
    assert engine.stats.batches[0].num_seqs < len(grounding_requests)
    assert compare_generations(eager_generations, generations).ok
    assert engine.num_free_blocks == 5


BAD = [
    (Request([], 4), "request 1: empty prompt"),
    (Request([1, 2, 3], 126), "request 1: prompt length 3 \\+ max_new_tokens 126 = 129 exceeds max_model_len 128"),
    (Request([1, 2], 3, logprobs=513), "request 1: logprobs 513 must lie in \\[0, vocab size 512\\]"),
    (Request([1, 2], 0), "request 1: max_new_tokens 0 must be an integer >= 1"),
    (Request([1, 512], 2), "request 1: prompt tokens \\[512\\] outside the vocabulary \\[0, 512\\)"),
]


@pytest.mark.parametrize("bad, message", BAD, ids=["empty", "too_long", "k_over_vocab", "no_new_tokens",
                                                   "token_out_of_vocab"])
def test_bad_request_names_index_and_limit_and_the_rest_complete(engine_factory, bad, message):
    good = mixed_requests(seed=3, prompt_lens=(4, 9), max_new_tokens=(3, 5))
    engine = engine_factory()
    with pytest.raises(ValueError, match=message) as info:
        engine.generate([good[0], bad, good[1]])
    assert isinstance(info.value, BadRequestError)
    assert [p.index for p in info.value.problems] == [1]
    results = info.value.generations
    assert results[1] is None
    assert results[0] == engine_factory().generate([good[0]])[0]
    assert results[2] == engine_factory().generate([good[1]])[0]
    assert engine.num_free_blocks == engine.kv_cache.num_blocks


def test_every_bad_request_is_listed(engine_factory):
    requests = [Request([7], 2), Request([], 1), Request([1], 0), Request([3, 4], 1)]
    with pytest.raises(BadRequestError) as info:
        engine_factory().generate(requests)
    text = str(info.value)
    assert "2 of 4 requests rejected" in text and "request 1:" in text and "request 2:" in text
    assert [g is None for g in info.value.generations] == [False, True, True, False]


def test_prompt_over_max_num_tokens_and_kv_budget_are_bad_requests(engine_factory):
    with pytest.raises(BadRequestError, match="request 0: prompt length 40 exceeds max_num_tokens 32"):
        engine_factory(max_num_tokens=32).generate([Request(list(range(40)), 2)])
    with pytest.raises(BadRequestError, match="request 0: needs 3 KV blocks of 16 tokens, the cache has 2"):
        engine_factory(num_blocks=2).generate([Request(list(range(40)), 2)])


@pytest.mark.parametrize("field, value", [("max_batch_size", 0), ("block_size", -1), ("num_blocks", 0),
                                          ("max_num_tokens", 2.5)])
def test_engine_config_rejects_bad_sizes(field, value):
    with pytest.raises(ValueError, match=f"EngineConfig.{field} must be an integer >= 1, got {value}"):
        EngineConfig(**{field: value})


@pytest.mark.parametrize("field, value, bad", [("decode_graph_sizes", (1, 2.7), "decode_graph_sizes\\[1\\]"),
                                               ("piecewise_buckets", (16, -1), "piecewise_buckets\\[1\\]")])
def test_engine_config_rejects_bad_graph_sizes(field, value, bad):
    with pytest.raises(ValueError, match=f"EngineConfig.{bad} must be an integer >= 1, got {value[1]}"):
        EngineConfig(**{field: value})


def test_engine_refuses_max_model_len_over_the_model_limit(reference_llama):
    limit = reference_llama.max_positions
    with pytest.raises(ValueError, match=f"max_model_len {limit + 1} exceeds the model's max_position_embeddings {limit}"):
        Engine(reference_llama, EngineConfig(max_model_len=limit + 1))


def test_engine_config_round_trips_through_a_dict():
    config = EngineConfig(max_batch_size=4, dtype="bfloat16", decode_graph_sizes=[1, 2, 4], single_pass_capture=True)
    assert config.dtype is torch.bfloat16 and config.decode_graph_sizes == (1, 2, 4)
    data = config.to_dict()
    assert data["dtype"] == "bfloat16"
    assert EngineConfig.from_dict(data) == config
    with pytest.raises(ValueError, match="unknown EngineConfig fields \\['colour'\\]"):
        EngineConfig.from_dict({**data, "colour": 1})


def test_engine_refuses_a_cache_dtype_other_than_the_model(reference_llama):
    with pytest.raises(ValueError, match="EngineConfig.dtype torch.float32 must match the model dtype torch.bfloat16"):
        Engine(reference_llama, EngineConfig(dtype=torch.float32))


def test_backend_is_kept_but_unused_in_eager_mode(engine_factory, grounding_requests):
    sentinel = object()
    engine = engine_factory(backend=sentinel)
    assert engine.backend is sentinel
    assert engine.generate(grounding_requests[:2])[0].steps[0].producer == "eager"


def test_an_error_mid_run_gives_the_blocks_back(reference_llama, grounding_requests):
    class FailsOnThirdStep(Engine):
        calls = 0

        def _forward(self, batch):
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("planted failure in step 3")
            return super()._forward(batch)

    engine = FailsOnThirdStep(reference_llama, TINY_ENGINE_CONFIG)
    with pytest.raises(RuntimeError, match="planted failure in step 3"):
        engine.generate(grounding_requests)
    assert engine.num_free_blocks == engine.kv_cache.num_blocks


def test_engine_refuses_a_device_other_than_the_model(reference_llama):
    assert Engine(reference_llama, EngineConfig(device="cpu")).kv_cache.device.type == "cpu"
    with pytest.raises(ValueError, match="model is on cpu, EngineConfig.device is meta"):
        Engine(reference_llama, EngineConfig(device="meta"))
