"""A resize path that regrows a captured input with `torch.cat` (TensorRT-LLM #16290 and #16319:
buffers reallocated after capture while graphs still held their old addresses; vLLM #53915: a
producer returning a fresh tensor each step). `cat` returns a new tensor; the runtime rebinds its
attribute, and the graph keeps reading the old address. Dropped, the old buffer is freed memory
the harness refuses to replay from; kept (a list of past buffers), the replay reads stale values,
and `moved_tensors` names the rebound attribute. Fixed: size the buffer for the largest batch
before capture and copy into its front."""

from __future__ import annotations

import pytest
import torch

from harness.check import moved_tensors, snapshot_tensors
from harness.graphs import FreedMemoryError


class Runner:
    def __init__(self, capacity: int) -> None:
        self.positions = torch.zeros(capacity, dtype=torch.long, device="cuda")
        self.history: list[torch.Tensor] = []
        self.out = torch.zeros(4, dtype=torch.long, device="cuda")
        self.graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph):
            self.out.copy_(self.positions[:4] + 1)

    def grow_buggy(self, extra: int, *, keep_old: bool) -> None:
        if keep_old:
            self.history.append(self.positions)
        self.positions = torch.cat([self.positions, torch.zeros(extra, dtype=torch.long,
                                                                device="cuda")])

    def prepare(self, positions: list[int]) -> None:
        self.positions[:len(positions)].copy_(torch.tensor(positions))


def test_a_dropped_buffer_regrown_by_cat_is_refused_at_replay():
    runner = Runner(4)
    runner.grow_buggy(4, keep_old=False)
    runner.prepare([5, 6, 7, 8])
    torch.zeros(4, dtype=torch.long, device="cuda")  # the next allocation of the old size
    with pytest.raises(FreedMemoryError, match="test_input_regrown_by_cat.py"):
        runner.graph.replay()


def test_a_kept_buffer_regrown_by_cat_is_named_by_moved_tensors():
    runner = Runner(4)
    before = snapshot_tensors(runner, "runner")
    runner.grow_buggy(4, keep_old=True)
    runner.prepare([5, 6, 7, 8])
    assert "runner.positions" in moved_tensors(before, snapshot_tensors(runner, "runner"))
    runner.graph.replay()
    assert runner.out.tolist() == [1, 1, 1, 1]  # stale: the old buffer, as on CUDA


def test_a_buffer_sized_before_capture_replays_the_new_positions():
    runner = Runner(8)
    before = snapshot_tensors(runner, "runner")
    runner.prepare([5, 6, 7, 8])
    assert moved_tensors(before, snapshot_tensors(runner, "runner")) == []
    runner.graph.replay()
    assert runner.out.tolist() == [6, 7, 8, 9]
