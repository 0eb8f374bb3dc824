"""Checking requests against the engine's limits before any work is done.

A bad request must not cost the good ones their results: `Engine.generate` runs every valid request
and then raises `BadRequestError` (a `ValueError`, defined with the Runtime contract in
`harness.records`) listing each bad one with the limit it broke. The error carries `.generations`,
one entry per request in order, `None` where the request was bad.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass


from harness.ops.sizing import cdiv
from harness.records import BadRequestError, Request, RequestProblem

__all__ = ["BadRequestError", "RequestLimits", "RequestProblem", "blocks_needed", "check_request"]


@dataclass(frozen=True)
class RequestLimits:
    """What a single request may ask of the engine (derived from the model and the EngineConfig)."""

    vocab_size: int
    max_model_len: int  # prompt + max_new_tokens
    max_prompt_len: int  # a prompt is prefilled in one step: at most max_num_tokens
    num_blocks: int  # KV blocks for the whole sequence
    block_size: int
    lookahead_tokens: int = 0  # K/V stored past the last fed token (the overlap's extra step)


def blocks_needed(request: Request, block_size: int, lookahead_tokens: int = 0) -> int:
    # The last generated token is never fed back, so its K/V is never stored -- except by the
    # overlap loop's extra step (`lookahead_tokens`), which runs before the host knows it finished.
    stored = len(request.prompt) + request.max_new_tokens - 1 + lookahead_tokens
    return cdiv(stored, block_size)


def check_request(request: Request, limits: RequestLimits) -> str | None:
    """Why `request` cannot run (naming the value and the limit), or None if it can."""
    prompt = request.prompt
    if not isinstance(request.max_new_tokens, numbers.Integral) or request.max_new_tokens < 1:
        return f"max_new_tokens {request.max_new_tokens!r} must be an integer >= 1"
    if len(prompt) == 0:
        return "empty prompt (at least 1 token needed)"
    bad_tokens = [t for t in prompt if not isinstance(t, numbers.Integral) or not 0 <= t < limits.vocab_size]
    if bad_tokens:
        return f"prompt tokens {bad_tokens[:5]} outside the vocabulary [0, {limits.vocab_size})"
    total = len(prompt) + request.max_new_tokens
    if total > limits.max_model_len:
        return (f"prompt length {len(prompt)} + max_new_tokens {request.max_new_tokens} = {total} "
                f"exceeds max_model_len {limits.max_model_len}")
    if len(prompt) > limits.max_prompt_len:
        return f"prompt length {len(prompt)} exceeds max_num_tokens {limits.max_prompt_len}"
    if not isinstance(request.logprobs, numbers.Integral) or not 0 <= request.logprobs <= limits.vocab_size:
        return f"logprobs {request.logprobs!r} must lie in [0, vocab size {limits.vocab_size}]"
    blocks = blocks_needed(request, limits.block_size, limits.lookahead_tokens)
    if blocks > limits.num_blocks:
        return f"needs {blocks} KV blocks of {limits.block_size} tokens, the cache has {limits.num_blocks}"
    return None
