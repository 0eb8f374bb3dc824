"""Reading a step's logits the one way every producer must: ranked tokens, fp32 logprobs, scale,
and from them the `Step`s every runtime returns (`logits_to_steps`, `steps_from_ranked`).

The ranking is by logit, best first; equal logits keep ascending token order, so the first entry is
the greedy token with ties to the lowest id. It is a `topk` over keys that break ties by id, not a
sort of the whole vocabulary. Logprobs are log_softmax
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


def ordered_bits(logits: torch.Tensor) -> torch.Tensor:
    """int32 [rows, vocab] ordered as the fp32 logits are (equal logits, equal values)."""
    # fp32 bits as an int32 that orders like the value (negative floats count down). +0.0 turns
    # -0.0 into +0.0: they are equal.
    bits = (logits + 0.0).view(torch.int32)
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def tie_broken_keys(logits: torch.Tensor) -> torch.Tensor:
    """int64 keys [rows, vocab] ordered as the fp32 logits are, equal logits ordered by ascending
    token id (the larger key first): `topk` of them ranks without a full sort and without leaving
    the order of ties to the kernel."""
    # `ordered_bits` in the high half; the complement of the id in the low half.
    ids = torch.arange(logits.shape[-1], device=logits.device)
    return ordered_bits(logits).to(torch.int64) * 2 ** 32 + (2 ** 32 - 1 - ids)


def rank_logits(logits: torch.Tensor, width: int) -> RankedLogits:
    """The best `width` tokens of each row of `logits` [rows, vocab] (at least one)."""
    logits = logits.float()
    if width <= 1:
        # The greedy token alone: argmax returns the first (lowest) index of equal maxima, which
        # is the tie-break the keys encode, so one reduction over the int32 bits picks topk's
        # first entry without the keys' five extra ops (nor a radix selection).
        order = ordered_bits(logits).argmax(dim=-1, keepdim=True)
    else:
        order = torch.topk(tie_broken_keys(logits), width, dim=-1).indices
    logprobs = torch.log_softmax(logits, dim=-1)
    return RankedLogits(order=order, top_logprobs=logprobs.gather(1, order), logprobs=logprobs,
                        scales=logits.abs().amax(dim=-1))


def check_packable(rows: int, vocab: int, n: int) -> None:
    """Refuse packing `n` of `rows` ranked rows over `vocab` tokens where the packed floats cannot
    hold them: more sequences than rows, or ids float32 cannot hold exactly."""
    if rows < n:
        raise ValueError(f"{rows} ranked rows for {n} sequences")
    if vocab > 2 ** 24:
        raise ValueError(f"a vocabulary of {vocab} tokens has ids float32 cannot hold exactly "
                         f"(at most 2**24)")


def pack_ranked(ranked: RankedLogits, n: int, width: int | None = None) -> torch.Tensor:
    """The first `n` rows of a ranking as one device tensor [n, 2 * width + 1] (float32: ids,
    logprobs, scale), so that one device-to-host transfer (each one is a sync, or an event to wait
    for) carries the whole batch. float32 holds the logprobs and scales as they are and token ids
    below 2**24 exactly."""
    check_packable(ranked.order.shape[0], ranked.logprobs.shape[-1], n)
    width = ranked.order.shape[1] if width is None else width
    return torch.cat([ranked.order[:n, :width].float(), ranked.top_logprobs[:n, :width],
                      ranked.scales[:n, None]], dim=1)


@dataclass(frozen=True)
class PackedRanking:
    """A ranking as a step hands it on: `values`, `pack_ranked`'s [rows, 2 * width + 1] tensor for the
    one transfer to the host, and `tokens`, each row's greedy token as int64 on the same device (the
    overlap loop feeds them to the next step without a host round trip)."""

    values: torch.Tensor
    tokens: torch.Tensor

    def steps(self, widths: Sequence[int], producer: str) -> list[Step]:
        """One `Step` per entry of `widths` (rows past them, a graph's padding, are dropped)."""
        return steps_from_packed(self.values[:len(widths)].cpu(), widths, producer)


def pack_ranking(ranked: RankedLogits, n: int, width: int | None = None) -> PackedRanking:
    """The first `n` rows of `ranked` as a `PackedRanking` (`pack_ranked`'s values)."""
    return PackedRanking(values=pack_ranked(ranked, n, width), tokens=ranked.order[:n, 0])


def steps_from_packed(packed: torch.Tensor, widths: Sequence[int], producer: str, *,
                      tokens: Sequence[int] | None = None) -> list[Step]:
    """One `Step` per entry of `widths` from `pack_ranked`'s output on the host (one read of the
    whole tensor), row i keeping its best `widths[i]` pairs. The token is the ranking's first
    (greedy, ties to the lowest id), or `tokens[i]` where the producer chose its own; its logprob is
    then the packed tensor's extra last column (`steps_from_ranked` adds it)."""
    width = (packed.shape[1] - 1 - (tokens is not None)) // 2
    steps = []
    for i, (values, k) in enumerate(zip(packed.tolist(), widths)):
        ids = [int(t) for t in values[:width]]
        lps = values[width:2 * width]
        token, logprob = (ids[0], lps[0]) if tokens is None else (int(tokens[i]), values[-1])
        steps.append(Step(token=token, logprob=logprob, top=tuple(zip(ids[:k], lps[:k])),
                          logit_scale=values[2 * width], producer=producer))
    return steps


def steps_from_ranked(ranked: RankedLogits, widths: Sequence[int], producer: str, *,
                      tokens: Sequence[int] | None = None) -> list[Step]:
    """One `Step` per entry of `widths`; rows past `len(widths)` (a graph's padding) are dropped.
    `tokens`: the producer's own tokens (their logprobs read from the full log_softmax)."""
    n = len(widths)
    packed = pack_ranked(ranked, n)
    if tokens is not None:
        chosen = torch.tensor(list(tokens), dtype=torch.int64, device=ranked.logprobs.device)[:, None]
        packed = torch.cat([packed, ranked.logprobs[:n].gather(1, chosen)], dim=1)
    return steps_from_packed(packed.cpu(), widths, producer, tokens=tokens)


def logits_to_steps(logits: torch.Tensor, widths: Sequence[int], producer: str, *,
                    tokens: Sequence[int] | None = None) -> list[Step]:
    """`steps_from_ranked(rank_logits(logits, max(widths)), ...)`: one Step per row of `logits`
    [rows, vocab]; how every producer of Steps reads a step's logits."""
    if logits.shape[0] != len(widths):
        raise ValueError(f"{logits.shape[0]} logit rows for {len(widths)} sequences")
    return steps_from_ranked(rank_logits(logits, max(widths, default=1)), widths, producer, tokens=tokens)
