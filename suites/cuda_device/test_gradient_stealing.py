"""A backward's gradient becomes `.grad` itself, as on CUDA, whatever streams exist.

Autograd's AccumulateGrad (torch/csrc/autograd/functions/accumulate_grad.h) steals the incoming
gradient into an empty `.grad` when nothing else holds it (its use count) and its layout matches
the leaf's; otherwise it clones. The engine's stream handling syncs producer and consumer streams
but keeps no reference. Until 2026-12-07 the emulated device cloned in two places: the first
`backward()` once stream tracking was on (a stream made, pinned memory) was learned by the call
patterns, whose probe held every op's result while the call ran; and under the adversarial
schedule a queued op's call held the results it hands out. Code that keeps `.grad` as the tensor
the backward made (cudagraph trees freeing a generation's outputs, a pool's blocks) saw a copy.
"""

from __future__ import annotations

import pytest
import torch

import harness

SHAPE = (7, 13)  # a signature no other check learns first


def _backward_and_compare(where: str) -> bool:
    """Whether `w.grad` is the very tensor the backward handed to AccumulateGrad."""
    seen: dict[str, int] = {}
    w = torch.ones(SHAPE, device="cuda", requires_grad=True)
    # a tensor hook sees the incoming gradient just before AccumulateGrad; it returns None, so
    # AccumulateGrad gets that tensor, and the hook keeps only its address
    w.register_hook(lambda g: seen.update(ptr=g.data_ptr()))
    side = torch.cuda.Stream() if where != "no stream" else None
    loss = (w * 3).sum()
    if where == "backward on the side stream":
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            loss.backward()
        torch.cuda.current_stream().wait_stream(side)
    else:
        loss.backward()
    torch.cuda.synchronize()
    assert w.grad.tolist() == [[3.0] * SHAPE[1]] * SHAPE[0]
    return w.grad.data_ptr() == seen["ptr"]


@pytest.mark.parametrize("where", ["no stream", "stream made before the backward",
                                   "backward on the side stream"])
def test_accumulate_grad_steals_the_backwards_gradient(cuda_kind, where):
    assert _backward_and_compare(where)


@pytest.mark.parametrize("where", ["no stream", "stream made before the backward"])
def test_accumulate_grad_steals_under_the_adversarial_schedule(outside_emulation, where):
    with harness.emulate_cuda(device="cpu", schedule="adversarial"):
        assert _backward_and_compare(where)
