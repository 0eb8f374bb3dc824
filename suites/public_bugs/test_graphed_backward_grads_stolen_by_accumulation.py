"""Gradient accumulation over a `torch.cuda.make_graphed_callables` module (PyTorch #181723,
"make_graphed_callables can silently corrupt parameter gradient accumulation by returning static
grad buffers"; TransformerEngine #2937, "Fix CUDA graph parameter grad lifetime"). The graphed
backward hands autograd the backward graph's static gradient buffers. With `param.grad` None,
AccumulateGrad keeps the incoming gradient itself, so after the first micro-batch `param.grad` is
the graph's buffer; the second micro-batch's replay rewrites it, and the accumulation adds the
buffer to itself: twice the last micro-batch's gradient, where eager sums both. Nothing is refused,
on CUDA or the emulated device. `explain_against_eager` names the accumulation's `add_` and why:
the gradient it adds into is read at the graph's address, whose contents the replay changed.
Fixed (TransformerEngine's fix, as a hook): each returned parameter gradient is cloned before
autograd accumulates it."""

from __future__ import annotations

import copy

import pytest
import torch

from harness.check.causes import CONTENTS_CHANGED
from harness.emulation import emulation_active
from harness.check.explain_cuda import explain_against_eager


class Trainer:
    """Two micro-batches accumulated into one step's gradients."""

    def __init__(self, *, graphed: bool, clone_grads: bool = False) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 3, bias=False).cuda()
        if graphed:
            sample = torch.randn(2, 4, device="cuda")
            torch.cuda.make_graphed_callables(self.model, (sample,))
        if clone_grads:
            for param in self.model.parameters():
                param.register_hook(torch.clone)
        self.batches = [torch.full((2, 4), 1.0, device="cuda"),
                        torch.full((2, 4), 2.0, device="cuda")]

    def step(self) -> list[float]:
        self.model.zero_grad(set_to_none=True)
        for batch in self.batches:
            self.model(batch).sum().backward()
        return self.model.weight.grad[0].tolist()


@pytest.mark.explains_against_eager
def test_accumulating_the_graphs_static_grads_doubles_the_last_micro_batch():
    graphed, eager = Trainer(graphed=True), Trainer(graphed=False)
    assert graphed.step() == [8.0] * 4  # 2 x the second batch's gradient (2 rows of 2.0)
    assert eager.step() == [6.0] * 4
    found = explain_against_eager(graphed.step, eager.step)
    assert found.diverged, found
    assert found.op == "aten.add_.Tensor", found
    if emulation_active() == "cpu":
        # on a GPU (natively and in the graph sanitizer) autograd accumulates on its device
        # thread, where no Python caller is known ("(no caller outside torch)", H100,
        # 2026-12-06); the emulated device's backward runs on the caller's thread
        assert ".backward()" in found.where, found
    assert found.cause is not None and found.cause.kind == CONTENTS_CHANGED, found


@pytest.mark.explains_against_eager
def test_cloned_grads_accumulate_as_eager():
    graphed = Trainer(graphed=True, clone_grads=True)
    eager = Trainer(graphed=False)
    assert graphed.step() == eager.step() == [6.0] * 4
    found = explain_against_eager(graphed.step, eager.step)
    assert not found.diverged, found
