"""Greedy choice and top-k logprobs from one step's logits.

Greedy is the argmax of the logits; among equal logits the lowest token id wins. The top-k list is
ordered by logit, best first, with the same tie rule (a `topk` over keys that break ties by id keeps equal logits in
ascending id order), so `top[0]` is always the chosen token. Logprobs are log_softmax in fp32. The
ranking runs here on the host, or inside a decode graph that ranks on the device
(`EngineConfig.graph_top_k`); either way it is `rank_logits`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.ranking import RankedLogits, rank_logits


@dataclass(frozen=True)
class SampledRow:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    logit_scale: float


def greedy_with_logprobs(logits: torch.Tensor, ks: list[int]) -> list[SampledRow]:
    """One row per sequence: logits [num_seqs, vocab]; `ks[i]` top pairs are kept for row i."""
    if logits.shape[0] != len(ks):
        raise ValueError(f"{logits.shape[0]} logit rows for {len(ks)} sequences")
    return rows_from_ranked(rank_logits(logits, max(ks, default=1)), ks)


def rows_from_ranked(ranked: RankedLogits, ks: list[int]) -> list[SampledRow]:
    """One row per sequence from logits already ranked (on the host, or inside a decode graph):
    row i keeps its first `ks[i]` pairs; rows past `len(ks)` (a graph's padding) are dropped."""
    return rows_from_packed(pack_ranked(ranked, len(ks)).cpu(), ks)


def pack_ranked(ranked: RankedLogits, n: int, width: int | None = None) -> torch.Tensor:
    """The first `n` rows of a ranking as one device tensor [n, 2 * width + 1] (float32: ids,
    logprobs, scale), so that one device-to-host transfer (each one is a sync, or an event to wait
    for) carries the whole batch. float32 holds the logprobs and scales as they are and token ids
    below 2**24 exactly."""
    if ranked.order.shape[0] < n:
        raise ValueError(f"{ranked.order.shape[0]} ranked rows for {n} sequences")
    if ranked.logprobs.shape[-1] > 2 ** 24:
        raise ValueError(f"a vocabulary of {ranked.logprobs.shape[-1]} tokens has ids float32 cannot "
                         f"hold exactly (at most 2**24)")
    width = ranked.order.shape[1] if width is None else width
    return torch.cat([ranked.order[:n, :width].float(), ranked.top_logprobs[:n, :width],
                      ranked.scales[:n, None]], dim=1)


def rows_from_packed(packed: torch.Tensor, ks: list[int]) -> list[SampledRow]:
    """SampledRows from `pack_ranked`'s output, on the host (one read of the whole tensor)."""
    width = (packed.shape[1] - 1) // 2
    rows = []
    for values, k in zip(packed.tolist(), ks):
        ids = [int(i) for i in values[:width]]
        lps = values[width:2 * width]
        rows.append(SampledRow(token=ids[0], logprob=lps[0], top=tuple(zip(ids[:k], lps[:k])),
                               logit_scale=values[2 * width]))
    return rows
