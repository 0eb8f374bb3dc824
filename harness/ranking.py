"""Reading a step's logits the one way every producer must: ranked tokens, fp32 logprobs, scale.

The ranking is by logit, best first; equal logits keep ascending token order (a stable descending
sort), so the first entry is the greedy token with ties to the lowest id. Logprobs are log_softmax
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


def rank_logits(logits: torch.Tensor, width: int) -> RankedLogits:
    """The best `width` tokens of each row of `logits` [rows, vocab] (at least one)."""
    logits = logits.float()
    order = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :max(width, 1)]
    logprobs = torch.log_softmax(logits, dim=-1)
    return RankedLogits(order=order, top_logprobs=logprobs.gather(1, order), logprobs=logprobs,
                        scales=logits.abs().amax(dim=-1))
