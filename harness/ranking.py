"""Reading a step's logits the one way every producer must: ranked tokens, fp32 logprobs, scale,
and from them the `Step`s every runtime returns (`logits_to_steps`, `steps_from_ranked`).

The ranking is by logit, best first; equal logits keep ascending token order (a stable descending
sort), so the first entry is the greedy token with ties to the lowest id. Logprobs are log_softmax
in fp32. The scale is max |logit|, which sets the bf16 spacing comparisons count in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from harness.records import Step


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


def steps_from_ranked(ranked: RankedLogits, widths: Sequence[int], producer: str, *,
                      tokens: Sequence[int] | None = None) -> list[Step]:
    """One `Step` per entry of `widths`, row i keeping its best `widths[i]` pairs; rows past
    `len(widths)` (a graph's padding) are dropped. The token is the ranking's first (greedy, ties to
    the lowest id), or `tokens[i]` where the producer chose its own (its logprob is then read from
    the full log_softmax). One device-to-host transfer for the whole batch."""
    n = len(widths)
    if ranked.order.shape[0] < n:
        raise ValueError(f"{ranked.order.shape[0]} ranked rows for {n} sequences")
    width = ranked.order.shape[1]
    columns = [ranked.order[:n].double(), ranked.top_logprobs[:n].double(), ranked.scales[:n].double()[:, None]]
    if tokens is not None:
        chosen = torch.tensor(list(tokens), dtype=torch.int64, device=ranked.logprobs.device)[:, None]
        columns.append(ranked.logprobs[:n].gather(1, chosen).double())
    # float64 holds float32 values and token ids below 2**53 exactly.
    packed = torch.cat(columns, dim=1).cpu().tolist()
    steps = []
    for i, (row, k) in enumerate(zip(packed, widths)):
        ids = [int(t) for t in row[:width]]
        lps = row[width:2 * width]
        token, logprob = (ids[0], lps[0]) if tokens is None else (int(tokens[i]), row[2 * width + 1])
        steps.append(Step(token=token, logprob=logprob, top=tuple(zip(ids[:k], lps[:k])),
                          logit_scale=row[2 * width], producer=producer))
    return steps


def logits_to_steps(logits: torch.Tensor, widths: Sequence[int], producer: str, *,
                    tokens: Sequence[int] | None = None) -> list[Step]:
    """`steps_from_ranked(rank_logits(logits, max(widths)), ...)`: one Step per row of `logits`
    [rows, vocab]; how every producer of Steps reads a step's logits."""
    if logits.shape[0] != len(widths):
        raise ValueError(f"{logits.shape[0]} logit rows for {len(widths)} sequences")
    return steps_from_ranked(rank_logits(logits, max(widths, default=1)), widths, producer, tokens=tokens)
