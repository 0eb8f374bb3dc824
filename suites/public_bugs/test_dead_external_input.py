"""An input buffer dropped after capture while the graph still reads it, masked by the allocator
handing its address to the next tensor (PyTorch #174649, FlashInfer #5287). The harness refuses the
replay, naming the capture's first use. Fixed: the runtime keeps the buffer as long as the graph."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import FreedMemoryError


class Step:
    def __init__(self, *, keep_input: bool) -> None:
        scratch = torch.ones(1024, device="cuda")
        self.scratch = scratch if keep_input else None
        self.out = torch.zeros(1024, device="cuda")
        self.graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph):
            self.out.copy_(scratch * 2)


def test_a_replay_reading_a_dropped_input_is_refused():
    step = Step(keep_input=False)
    torch.full((1024,), 7.0, device="cuda")  # the next allocation of its size
    with pytest.raises(FreedMemoryError, match="test_dead_external_input.py"):
        step.graph.replay()


def test_a_kept_input_replays():
    step = Step(keep_input=True)
    step.graph.replay()
    assert step.out.sum().item() == 2048.0
