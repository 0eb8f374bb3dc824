"""TensorRT-LLM #18022 without an explicit reset: a scratch tensor first allocated inside graph
A's capture (so in A's private pool) is kept in a dict and read by graph B; the runtime drops A
(garbage collected, as an LRU of graphs does) and the cached scratch with it. B's replay would read
memory the allocator has released; the harness refuses it, naming B's capture line and the other
pool. Fixed: the scratch is allocated before any capture, or kept with a graph that outlives B."""

from __future__ import annotations

import gc

import pytest
import torch

from harness.graphs import FreedMemoryError


class TwoGraphs:
    def __init__(self, *, scratch_before_capture: bool) -> None:
        self.x = torch.ones(8, device="cuda")
        self.out = torch.zeros(8, device="cuda")
        self.cache: dict[str, torch.Tensor] = {}
        if scratch_before_capture:
            self.cache["scratch"] = torch.zeros(8, device="cuda")
        torch.cuda.synchronize()
        self.first = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.first):
            if "scratch" not in self.cache:
                self.cache["scratch"] = torch.empty(8, device="cuda")
            self.cache["scratch"].copy_(self.x * 3)
        self.second = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.second):
            self.out.copy_(self.cache["scratch"] + 1)

    def drop_first(self) -> None:
        self.first = None
        self.cache.clear()
        gc.collect()
        torch.cuda.empty_cache()  # CUDA releases the pool's memory for anyone to take


def test_a_replay_reading_the_scratch_of_a_collected_graph_is_refused():
    graphs = TwoGraphs(scratch_before_capture=False)
    graphs.first.replay()
    graphs.second.replay()
    assert graphs.out.tolist() == [4.0] * 8
    graphs.drop_first()
    with pytest.raises(FreedMemoryError, match=r"another graph's private pool[\s\S]*freed") as caught:
        graphs.second.replay()
    assert "test_workspace_of_a_collected_graph.py" in str(caught.value)


def test_a_scratch_allocated_before_capture_outlives_the_collected_graph():
    graphs = TwoGraphs(scratch_before_capture=True)
    graphs.first.replay()
    scratch = graphs.cache["scratch"]
    graphs.drop_first()
    graphs.second.replay()
    assert graphs.out.tolist() == [4.0] * 8
    del scratch
