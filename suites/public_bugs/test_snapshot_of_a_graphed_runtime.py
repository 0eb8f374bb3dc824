"""The documented recipe against rebound metadata (SGLang #26019, vLLM #40648): snapshot the
runtime's tensors after capture, then `moved_tensors` before each replay. On a runtime that holds its
`torch.cuda.CUDAGraph` the walk must stay out of the graph's internals (it raised ValueError, nested
deeper than 64 levels) and still name a rebound tensor, private attributes included."""

from __future__ import annotations

import torch

from harness.check import describe_moved, moved_tensors, snapshot_tensors


class Metadata:
    def __init__(self) -> None:
        self.seq_lens = torch.zeros(4, dtype=torch.int32, device="cuda")
        self._block_tables = torch.zeros(4, 2, dtype=torch.int32, device="cuda")


class Runner:
    def __init__(self) -> None:
        self.metadata = Metadata()
        self.out = torch.zeros(4, dtype=torch.int32, device="cuda")
        self.graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph):
            self.out.copy_(self.metadata.seq_lens + self.metadata._block_tables.sum(-1))

    def prepare_buggy(self, seq_lens: list[int]) -> None:
        self.metadata._block_tables = torch.ones(4, 2, dtype=torch.int32, device="cuda")  # rebound
        self.metadata.seq_lens.copy_(torch.tensor(seq_lens, dtype=torch.int32))

    def prepare_fixed(self, seq_lens: list[int]) -> None:
        self.metadata._block_tables.fill_(1)
        self.metadata.seq_lens.copy_(torch.tensor(seq_lens, dtype=torch.int32))


def test_rebound_metadata_is_named_by_path():
    runner = Runner()
    before = snapshot_tensors(runner, "runner")
    runner.prepare_buggy([1, 2, 3, 4])
    after = snapshot_tensors(runner, "runner")
    assert moved_tensors(before, after) == ["runner.metadata._block_tables"]
    assert "data pointer changed" in describe_moved(before, after)
    assert before.paths_not_walked  # the graph's machinery, listed and skipped


def test_metadata_copied_into_moves_nothing_and_replays_the_new_batch():
    runner = Runner()
    before = snapshot_tensors(runner, "runner")
    runner.prepare_fixed([1, 2, 3, 4])
    assert moved_tensors(before, snapshot_tensors(runner, "runner")) == []
    runner.graph.replay()
    assert runner.out.tolist() == [3, 4, 5, 6]
