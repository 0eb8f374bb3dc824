"""A CPU scalar read from a device tensor before capture and passed into the captured step: the
longest sequence length (`int(seq_lens.max())`) that sizes the kernel, or a scale (FlashAttention
#1164, FlashInfer #4647). The graph bakes the capture batch's value; replays with a new batch
still use it. Nothing to refuse at replay, so `explain_against_eager` names the op, the line and
the cause ("host value frozen at capture": the graph passes 3, eager 5). Fixed: the kernel reads
the device tensor, which the runtime copies each step's value into."""

from __future__ import annotations

import pytest
import torch

from harness.check.causes import HOST_VALUE_FROZEN
from harness.check.explain_cuda import explain_against_eager


class Step:
    def __init__(self, *, reads_the_device_tensor: bool) -> None:
        self.reads_device = reads_the_device_tensor
        self.longest = torch.tensor(3, device="cuda")
        self.x = torch.arange(8.0, device="cuda")
        self.out = torch.zeros(8, device="cuda")

    def body(self, longest: int) -> None:
        self.out.copy_(self.x * (self.longest if self.reads_device else longest))

    def graphed(self) -> torch.Tensor:
        longest = int(self.longest)  # the capture batch's value, read on the host
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            self.body(longest)
        self.longest.fill_(5)  # the next batch
        graph.replay()
        return self.out

    def eager(self) -> torch.Tensor:
        self.longest.fill_(5)
        self.body(int(self.longest))
        return self.out


def _explained(*, reads_the_device_tensor: bool):
    graphed, eager = (Step(reads_the_device_tensor=reads_the_device_tensor) for _ in range(2))
    return explain_against_eager(graphed.graphed, eager.eager)


@pytest.mark.explains_against_eager
def test_a_host_scalar_baked_at_capture_is_named_with_its_frozen_value():
    found = _explained(reads_the_device_tensor=False)
    assert found.diverged, found
    assert found.op == "aten.mul.Tensor"
    assert "test_host_scalar_read_before_capture.py" in found.where and "self.x *" in found.where
    assert found.cause is not None and found.cause.kind == HOST_VALUE_FROZEN
    assert "= 3" in found.cause.detail and "eager passes 5" in found.cause.detail, found.cause


@pytest.mark.explains_against_eager
def test_the_kernel_reading_the_device_tensor_follows_the_new_batch():
    found = _explained(reads_the_device_tensor=True)
    assert not found.diverged, found
    assert found.replays_compared == 1 and found.ops_compared >= 1
    graphed = Step(reads_the_device_tensor=True)
    assert graphed.graphed().tolist() == [5.0 * i for i in range(8)]
