"""How a decode step ranks its logits when every sequence wants the greedy token alone: "fused"
(one op, `harness::greedy_pack`: two Triton kernels on CUDA) or "separate" (`rank_logits` and
`pack_ranked`'s torch ops, about ten kernels). Wider rankings (top-k logprobs) always take the
torch ops.

`choose_greedy_ranking` turns a request (None: choose for the device) into a
`GreedyRankingChoice` that names the mode and why; the engine keeps it as `Engine.greedy_ranking`
and counts a fallback when CUDA has to do without triton. "fused" is right on every device (its
torch implementation, which serves the CPU and the emulated CUDA device, is the separate path's
ops); only on real CUDA does it need triton.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.ops.fused_choice import FUSED_MODES, FusedModeChoice, choose_fused_mode

GREEDY_RANKINGS = FUSED_MODES


@dataclass(frozen=True)
class GreedyRankingChoice(FusedModeChoice):
    """The greedy-ranking mode chosen, and why (fields as `FusedModeChoice`)."""


def choose_greedy_ranking(requested: str | None, device: torch.device | str) -> GreedyRankingChoice:
    """The greedy-ranking mode for a model on `device`. None picks "fused" on a real CUDA device
    where triton imports, else "separate"; an explicit "fused" on CUDA without triton is refused
    (its CUDA kernels are Triton kernels), anywhere else it runs the op's torch implementation."""
    return choose_fused_mode("greedy_ranking", requested, device, GreedyRankingChoice)
