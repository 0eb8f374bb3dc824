"""Python side effects inside the captured step (PyTorch #114844): the step counts decode steps in a
Python attribute and scales its rotary phase by that count. A replay runs the recorded kernels
only, as on CUDA: the counter stays at its capture-time value, and every replay reuses the phase
baked at capture. Nothing to refuse; `explain_against_eager` names the op, its line and the frozen
host value (the graph passes 1 at the second replay, eager 2), and the counter itself is left behind.
Fixed: the count lives in a device tensor the graph advances, and host bookkeeping happens
outside the captured function."""

from __future__ import annotations

import pytest
import torch

from harness.check.causes import HOST_VALUE_FROZEN
from harness.check.explain_cuda import explain_against_eager

STEPS = 3


class Decoder:
    def __init__(self, *, count_on_device: bool) -> None:
        self.count_on_device = count_on_device
        self.steps_done = 0  # Python bookkeeping
        self.step_tensor = torch.zeros((), device="cuda")
        self.hidden = torch.ones(8, device="cuda")
        self.out = torch.zeros(8, device="cuda")

    def step(self) -> None:
        if self.count_on_device:
            self.step_tensor.add_(1)
            self.out.copy_(self.hidden * self.step_tensor)
        else:
            self.steps_done += 1  # a side effect: runs at capture, never at replay
            self.out.copy_(self.hidden * self.steps_done)

    def graphed(self) -> torch.Tensor:
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            self.step()
        self.step_tensor.zero_()  # the capture ran the step once: start the count again
        for _ in range(STEPS):
            graph.replay()
        return self.out

    def eager(self) -> torch.Tensor:
        for _ in range(STEPS):
            self.step()
        return self.out


@pytest.mark.explains_against_eager
def test_a_python_counter_in_the_captured_step_is_frozen_at_capture():
    graphed, eager = Decoder(count_on_device=False), Decoder(count_on_device=False)
    found = explain_against_eager(graphed.graphed, eager.eager)
    assert found.diverged, found
    assert found.op == "aten.mul.Tensor" and "self.hidden * self.steps_done" in found.where
    assert found.cause is not None and found.cause.kind == HOST_VALUE_FROZEN, found.cause
    assert "= 1" in found.cause.detail and "eager passes 2" in found.cause.detail, found.cause
    assert graphed.steps_done == 1 and eager.steps_done == STEPS  # the replays ran no Python


@pytest.mark.explains_against_eager
def test_a_count_kept_on_the_device_advances_at_every_replay():
    graphed, eager = Decoder(count_on_device=True), Decoder(count_on_device=True)
    found = explain_against_eager(graphed.graphed, eager.eager)
    assert not found.diverged, found
    assert Decoder(count_on_device=True).graphed().tolist() == [float(STEPS)] * 8
