"""The greedy ranking as one op, and the ranking a decode step packs for its one transfer.

- `harness::greedy_pack(logits, pdl)`: (values [rows, 3] float32, tokens [rows] int64), each row's
  greedy token (ties to the lowest id), its logprob and the row's max |logit|, laid out as
  `pack_ranked` lays out a width-1 ranking. CUDA: the two Triton kernels of `triton_greedy.py`
  (imported on the first CUDA call); every other device (the CPU, the emulated CUDA device): the
  torch ops of `rank_logits` and `pack_ranked`, bit for bit the separate path; fake: empty outputs,
  so dynamo keeps the op as one opaque call.
- `rank_and_pack(logits, n, width, mode=..., pdl=...)`: the `PackedRanking` of the first `n` rows,
  through the op where `mode` is "fused" and the width is 1 (greedy_ranking_choice.py), else through
  `pack_ranking(rank_logits(...))`.

The token is the torch path's exactly on every device; on CUDA the logprob differs from
log_softmax's by float rounding (a few fp32 ulps: triton_greedy.py says why).
"""

from __future__ import annotations

import torch

from harness.ranking import PackedRanking, check_packable, pack_ranked, pack_ranking, rank_logits


def _greedy_pack_torch(logits: torch.Tensor, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    ranked = rank_logits(logits, 1)
    return pack_ranked(ranked, logits.shape[0], 1), ranked.order[:, 0].clone()


greedy_pack_op = torch.library.custom_op("harness::greedy_pack", mutates_args=())(_greedy_pack_torch)


@greedy_pack_op.register_kernel("cuda")
def _(logits, pdl=False):
    from harness.ops.triton_greedy import greedy_pack_triton

    return greedy_pack_triton(logits, pdl)


@greedy_pack_op.register_fake
def _(logits, pdl=False):
    rows = logits.shape[0]
    return (logits.new_empty((rows, 3), dtype=torch.float32),
            logits.new_empty((rows,), dtype=torch.int64))


def greedy_pack(logits: torch.Tensor, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked call of `harness::greedy_pack` on `logits` [rows, vocab]."""
    return _checked_greedy_pack(logits, logits.shape[0] if logits.dim() else 0, pdl)


def _checked_greedy_pack(logits: torch.Tensor, n: int, pdl: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`harness::greedy_pack` on `logits` [rows, vocab], refused where its first `n` rows cannot be
    packed."""
    if logits.dim() != 2:
        raise ValueError(f"greedy_pack: logits must be [rows, vocab], got {tuple(logits.shape)}")
    check_packable(logits.shape[0], logits.shape[1], n)
    return greedy_pack_op(logits, pdl)


def rank_and_pack(logits: torch.Tensor, n: int, width: int, *, mode: str = "separate",
                  pdl: bool = False) -> PackedRanking:
    """The first `n` rows of `logits` [rows, vocab] ranked `width` wide and packed for one transfer;
    `mode` "fused" takes `harness::greedy_pack` at width 1 (its kernels launched with PDL where
    `pdl`), every other case the torch ops."""
    if mode == "fused" and width <= 1:
        values, tokens = _checked_greedy_pack(logits, n, pdl)
        return PackedRanking(values=values[:n], tokens=tokens[:n])
    return pack_ranking(rank_logits(logits, width), n, width)
