"""A per-stream workspace first allocated inside graph A's capture, so A's private pool owns it,
reused by graph B (TensorRT-LLM #18022); A evicted with its workspace (TensorRT-LLM #16176): B's
replay would write into memory the allocator hands to anyone. The harness refuses it. Fixed: the
shared workspace is allocated before any capture."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import FreedMemoryError


class Graphs:
    """Graphs by batch size, each step using the stream's workspace; an LRU may evict one."""

    def __init__(self, *, workspace_before_capture: bool) -> None:
        self.workspaces: dict[int, torch.Tensor] = {}
        self.created_by: dict[int, int] = {}  # graph size -> the workspace its capture created
        self.per_stream = not workspace_before_capture
        if workspace_before_capture:
            self._workspace()
        self.x = torch.ones(8, device="cuda")
        self.out = torch.zeros(8, device="cuda")
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        torch.cuda.synchronize()
        for size in (2, 4):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                known = set(self.workspaces)
                ws = self._workspace()
                self.created_by.update({size: key for key in set(self.workspaces) - known})
                ws[:size].copy_(self.x[:size] * size)
                self.out[:size].copy_(ws[:size])
            self.graphs[size] = graph

    def _workspace(self) -> torch.Tensor:
        stream = torch.cuda.current_stream().stream_id if self.per_stream else 0
        if stream not in self.workspaces:
            self.workspaces[stream] = torch.zeros(8, device="cuda")
        return self.workspaces[stream]

    def evict(self, size: int) -> None:
        self.graphs.pop(size).reset()
        key = self.created_by.pop(size, None)
        if key is not None:
            del self.workspaces[key]  # evicted with the graph whose capture created it
        # CUDA's allocator hands the pool's addresses out once it releases cached memory
        torch.cuda.empty_cache()


def test_a_replay_into_a_workspace_freed_with_another_graph_is_refused():
    graphs = Graphs(workspace_before_capture=False)
    graphs.graphs[4].replay()
    graphs.evict(2)
    with pytest.raises(FreedMemoryError, match="another graph"):
        graphs.graphs[4].replay()


def test_a_workspace_allocated_before_capture_survives_the_eviction():
    graphs = Graphs(workspace_before_capture=True)
    graphs.evict(2)
    graphs.graphs[4].replay()
    assert graphs.out[:4].tolist() == [4.0] * 4
