"""A runtime's reproducible mode turns on `torch.use_deterministic_algorithms(True)` and samples
with top-p (the sorted probabilities' running sum, `cumsum`) and draws several samples per row
with `torch.multinomial(probs, n, replacement=True)`. CUDA's float cumsum raised "cumsum_cuda_kernel
does not have a deterministic implementation" (PyTorch #89492), and multinomial's CUDA kernel took
its own running sum for more than one sample with replacement, so fixing the top-p mask alone still
raised (PyTorch #152854). Both issues are closed: on the builds the harness supports cumsum is
deterministic, and both samplers run under the mode (measured on an NVIDIA H100, torch
2.11.0+cu130, 2026-12-07). The emulated device had followed the older sources and raised where
CUDA no longer does, failing a runtime's reproducible CI that passes on a GPU. Two runs from one
seed give the same tokens, with the plain sampler and with the fixed-point one (the top-p mass
summed as integers, each sample drawn by the exponential race), all within top-p."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest
import torch

SAMPLES = 4
TOP_P = 0.8
FIXED_POINT = 1 << 24


@contextlib.contextmanager
def _reproducible_mode() -> Iterator[None]:
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)


def _top_p_mask(sorted_probs: torch.Tensor, *, fixed_point: bool) -> torch.Tensor:
    """Which sorted tokens lie outside the top-p mass (the first one always kept)."""
    if fixed_point:
        mass = (sorted_probs * FIXED_POINT).round().long().cumsum(-1)
        return (mass - (sorted_probs * FIXED_POINT).round().long()) > int(TOP_P * FIXED_POINT)
    return (sorted_probs.cumsum(-1) - sorted_probs) > TOP_P


def sample(logits: torch.Tensor, generator: torch.Generator | None = None, *,
           fixed: bool) -> torch.Tensor:
    probs = logits.softmax(-1)
    sorted_probs, order = probs.sort(-1, descending=True)
    sorted_probs = sorted_probs.masked_fill(_top_p_mask(sorted_probs, fixed_point=fixed), 0.0)
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    kept = kept / kept.sum(-1, keepdim=True)
    if not fixed:
        return torch.multinomial(kept, SAMPLES, replacement=True, generator=generator)
    race = torch.empty(*kept.shape[:-1], SAMPLES, kept.shape[-1], device=kept.device)
    race.exponential_(generator=generator)
    return (kept.unsqueeze(-2) / race).argmax(-1)


def _logits() -> torch.Tensor:
    return torch.randn(3, 32, generator=torch.Generator().manual_seed(0)).to("cuda") * 3


def _within_top_p(logits: torch.Tensor, tokens: torch.Tensor) -> None:
    probs = logits.softmax(-1).cpu()
    for row, drawn in zip(probs, tokens.cpu()):
        sorted_probs, order = row.sort(descending=True)
        allowed = order[(sorted_probs.cumsum(0) - sorted_probs) <= TOP_P]
        assert set(drawn.tolist()) <= set(allowed.tolist()), (drawn, allowed)


@pytest.mark.parametrize("fixed", [False, True], ids=["float-cumsum-and-multinomial",
                                                   "fixed-point-and-exponential-race"])
def test_both_samplers_repeat_from_a_seed_within_top_p_under_the_mode(fixed):
    logits = _logits()
    with _reproducible_mode():
        first = sample(logits, torch.Generator("cuda").manual_seed(7), fixed=fixed)
        second = sample(logits, torch.Generator("cuda").manual_seed(7), fixed=fixed)
    assert first.shape == (3, SAMPLES) and torch.equal(first, second)
    _within_top_p(logits, first)
