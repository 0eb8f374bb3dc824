"""Queued device work under the adversarial schedule runs as it was launched."""

from __future__ import annotations

import pytest
import torch

import harness
from fixtures.emulated_device import skip_unless_the_emulated_device_can_be_entered

pytestmark = [pytest.mark.filterwarnings("ignore::harness.emulation.tracking.RaceWarning")]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def test_a_queued_op_runs_in_the_state_it_was_issued_in():
    """An autocast the host entered before the queue ran recasts nothing: CUDA launched the
    kernel in float32."""
    skip_unless_the_emulated_device_can_be_entered()
    with harness.emulate_cuda(device="cpu", schedule="adversarial"):
        torch.manual_seed(0)
        a = torch.randn(16, 16, device="cuda")
        b = torch.randn(16, 16, device="cuda")
        out = torch.matmul(a, b)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.cuda.synchronize()  # the queued mm runs here
        got, expected = out.cpu(), torch.matmul(a.cpu(), b.cpu())
    assert _same_bits(got, expected), "the queued aten op ran under the later autocast"
