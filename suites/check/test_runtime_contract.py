"""The `harness.records.Runtime` contract, held against every runtime the harness ships: the reference
engine and the transformers adapter, eager and in graph mode on the session's graph backend.

`check_runtime_contract` is what a runtime of one's own can be held to as well: one Generation per
request in order, exactly `max_new_tokens` greedy steps, `top` of `logprobs` pairs with the token
first (none for 0), and a bad request costing the others nothing: the valid ones run, then
`BadRequestError` names each bad one and carries the others' generations.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from fixtures.models import TINY_ENGINE_CONFIG, TINY_SEED
from harness.adapters.transformers import TransformersRuntime
from harness.model import ReferenceLlama, tiny_llama
from harness.records import BadRequestError, Generation, Request, Runtime
from harness.runtime import Engine

GOOD = [Request([5, 6, 7], 4, logprobs=3), Request([9, 8, 7], 3, logprobs=0), Request([1, 2, 3], 2, logprobs=1)]
# Each breaks one limit of the contract; interleaved with the good ones.
BAD = {
    1: (Request([], 2), "empty prompt"),
    3: (Request([1, 2], 0), "max_new_tokens 0"),
    5: (Request([1, 2], 2, logprobs=-1), "logprobs -1"),
    6: (Request([10**6], 2), "outside the vocabulary"),
}


def check_steps(request: Request, generation: Generation) -> None:
    assert len(generation.steps) == len(generation.tokens) == request.max_new_tokens, generation
    for step in generation.steps:
        assert len(step.top) == request.logprobs, (step, request)
        if step.top:
            assert step.top[0][0] == step.token and step.top[0][1] == pytest.approx(step.logprob)
            assert [lp for _, lp in step.top] == sorted((lp for _, lp in step.top), reverse=True)
        assert step.logprob <= 0 and math.isfinite(step.logprob)
        assert step.logit_scale > 0 and isinstance(step.producer, str) and step.producer


def check_runtime_contract(runtime: Runtime) -> None:
    """Raises AssertionError naming the first clause of the Runtime contract `runtime` breaks."""
    assert isinstance(runtime, Runtime)
    generations = runtime.generate(GOOD)
    assert len(generations) == len(GOOD)
    for request, generation in zip(GOOD, generations):
        check_steps(request, generation)

    mixed = list(GOOD)
    for index in sorted(BAD):
        mixed.insert(index, BAD[index][0])
    try:
        runtime.generate(mixed)
    except BadRequestError as caught:
        error = caught
    except Exception as other:
        raise AssertionError(f"bad requests must raise BadRequestError once the good ones ran; got "
                             f"{type(other).__name__}: {other}") from other
    else:
        raise AssertionError(f"requests {sorted(BAD)} break the contract's limits but were run")
    assert [p.index for p in error.problems] == sorted(BAD), str(error)
    for problem in error.problems:
        assert f"request {problem.index}: " in str(error) and BAD[problem.index][1] in problem.reason, str(error)
    assert len(error.generations) == len(mixed)
    ran = [(r, g) for i, (r, g) in enumerate(zip(mixed, error.generations)) if i not in BAD]
    assert all(error.generations[i] is None for i in BAD)
    for (request, generation), alone in zip(ran, generations):
        check_steps(request, generation)
        assert generation.tokens == alone.tokens  # the bad requests changed nothing for the good


@pytest.fixture(scope="module")
def hf_model(device):
    return tiny_llama(seed=TINY_SEED, device=device)


def make_runtime(kind: str, hf_model, graph_backend) -> Runtime:
    if kind == "engine-eager":
        return Engine(ReferenceLlama.from_hf(hf_model), TINY_ENGINE_CONFIG)
    if kind == "engine-graphs":
        config = replace(TINY_ENGINE_CONFIG, decode_graph_sizes=(4, 2, 1), graph_top_k=(1, 4))
        return Engine(ReferenceLlama.from_hf(hf_model), config, backend=graph_backend)
    if kind == "transformers-eager":
        return TransformersRuntime(hf_model, max_cache_len=32)
    return TransformersRuntime(hf_model, backend=graph_backend, graph_sizes=(1, 2, 4), max_cache_len=32)


@pytest.mark.parametrize("kind", ["engine-eager", "engine-graphs", "transformers-eager", "transformers-graphs"])
def test_every_runtime_keeps_the_contract(kind, hf_model, graph_backend):
    check_runtime_contract(make_runtime(kind, hf_model, graph_backend))


class RefusesBeforeRunning:
    """A runtime that breaks the contract as the adapter once did: a bad request stops every request."""

    def __init__(self, inner: Runtime) -> None:
        self.inner = inner

    def generate(self, requests):
        for index, request in enumerate(requests):
            if not request.prompt:
                raise ValueError(f"request {index}: empty prompt")
        return self.inner.generate(requests)


def test_the_contract_check_fails_a_runtime_that_refuses_before_running(hf_model, graph_backend):
    with pytest.raises(AssertionError, match="must raise BadRequestError once the good ones ran; got "
                                             "ValueError: request 1: empty prompt"):
        check_runtime_contract(RefusesBeforeRunning(make_runtime("engine-eager", hf_model, graph_backend)))
