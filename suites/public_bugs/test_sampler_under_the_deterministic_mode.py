"""A runtime's reproducible mode turns on `torch.use_deterministic_algorithms(True)` and samples
with top-p (the sorted probabilities' running sum, `cumsum`) and draws several samples per row
with `torch.multinomial(probs, n, replacement=True)`. CUDA has no deterministic cumsum of floats:
the kernel raises "cumsum_cuda_kernel does not have a deterministic implementation" (PyTorch
#89492), and multinomial's CUDA kernel takes its own running sum of the rows for more than one
sample with replacement, so fixing the top-p mask alone still raises the same error (PyTorch
#152854). The emulated device ran the CPU's deterministic kernels and let both through until it
alerted as CUDA's kernels do. Fixed: the top-p mass summed in fixed point (an integer cumsum, exact
and deterministic) and each sample drawn by the exponential race (`probs / Exp(1)`, argmax), which
sum nothing; two runs from one seed give the same tokens."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest
import torch

NO_DETERMINISTIC_CUMSUM = ("cumsum_cuda_kernel does not have a deterministic implementation, but "
                           "you set 'torch.use_deterministic_algorithms(True)'.")
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


def test_top_p_by_a_float_cumsum_raises_cudas_alert():
    with _reproducible_mode(), pytest.raises(RuntimeError) as raised:
        sample(_logits(), fixed=False)
    assert str(raised.value).startswith(NO_DETERMINISTIC_CUMSUM), raised.value


def test_multinomial_with_replacement_raises_the_same_alert_inside_its_kernel():
    kept = _logits().softmax(-1)
    with _reproducible_mode(), pytest.raises(RuntimeError) as raised:
        torch.multinomial(kept, SAMPLES, replacement=True)
    assert str(raised.value).startswith(NO_DETERMINISTIC_CUMSUM), raised.value


def test_fixed_point_mass_and_exponential_race_sample_reproducibly_within_top_p():
    logits = _logits()
    with _reproducible_mode():
        first = sample(logits, torch.Generator("cuda").manual_seed(7), fixed=True)
        second = sample(logits, torch.Generator("cuda").manual_seed(7), fixed=True)
    assert first.shape == (3, SAMPLES) and torch.equal(first, second)
    probs = logits.softmax(-1).cpu()
    for row, tokens in zip(probs, first.cpu()):
        sorted_probs, order = row.sort(descending=True)
        allowed = order[(sorted_probs.cumsum(0) - sorted_probs) <= TOP_P]
        assert set(tokens.tolist()) <= set(allowed.tolist()), (tokens, allowed)
