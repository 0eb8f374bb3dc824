"""Reading a step's logits the one way every producer must: ranked tokens, fp32 logprobs, scale.

The ranking is by logit, best first; equal logits keep ascending token order, so the first entry is
the greedy token with ties to the lowest id. It is a `topk` over keys that break ties by id, not a
sort of the whole vocabulary. Logprobs are log_softmax
in fp32. The scale is max |logit|, which sets the bf16 spacing comparisons count in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RankedLogits:
    order: torch.Tensor        # [rows, width] token ids, best first
    top_logprobs: torch.Tensor  # [rows, width] their logprobs
    logprobs: torch.Tensor     # [rows, vocab] every token's logprob
    scales: torch.Tensor       # [rows] max |logit|


def tie_broken_keys(logits: torch.Tensor) -> torch.Tensor:
    """int64 keys [rows, vocab] ordered as the fp32 logits are, equal logits ordered by ascending
    token id (the larger key first): `topk` of them ranks without a full sort and without leaving
    the order of ties to the kernel."""
    # fp32 bits as an int32 that orders like the value (negative floats count down), in the high
    # half; the complement of the id in the low half. +0.0 turns -0.0 into +0.0: they are equal.
    bits = (logits + 0.0).view(torch.int32)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)
    ids = torch.arange(logits.shape[-1], device=logits.device)
    return ordered * 2 ** 32 + (2 ** 32 - 1 - ids)


def rank_logits(logits: torch.Tensor, width: int) -> RankedLogits:
    """The best `width` tokens of each row of `logits` [rows, vocab] (at least one)."""
    logits = logits.float()
    order = torch.topk(tie_broken_keys(logits), max(width, 1), dim=-1).indices
    logprobs = torch.log_softmax(logits, dim=-1)
    return RankedLogits(order=order, top_logprobs=logprobs.gather(1, order), logprobs=logprobs,
                        scales=logits.abs().amax(dim=-1))
