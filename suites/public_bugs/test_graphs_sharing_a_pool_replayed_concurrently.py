"""Two graphs captured into one memory pool (`pool=first.pool()`, as runtimes share one pool
across their batch-size graphs) replayed at the same time on two streams, to overlap two
micro-batches. Sharing a pool is safe only when the graphs run one after another: the second
capture was handed the blocks of the first graph's freed intermediates, so two concurrent replays
write the same memory (PyTorch #137844: "you only ever run the CUDA graphs in the same order one
after another", https://github.com/pytorch/pytorch/issues/137844 ; vLLM's dual-batch overlap
captures both micro-batches into one graph instead, https://github.com/vllm-project/vllm/issues/50738
and https://github.com/vllm-project/vllm/pull/51700). On CUDA the
intermediates are silently corrupted; the harness's stream tracking reports the two replays'
writes as a race, naming both replays and lines. Fixed: the second replay waits for the first
(or each micro-batch gets a graph in a pool of its own)."""

from __future__ import annotations

import pytest
import torch

from harness.emulation import track_stream_races
from harness.emulation.tracking import RaceError

N = 1 << 12


class Overlap:
    def __init__(self) -> None:
        self.x = torch.ones(N, device="cuda")
        self.first, self.second = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(self.first):
            hidden = self.x * 2  # freed at the capture's end: its block goes back to the pool
            self.out_first = hidden + 1
            del hidden
        with torch.cuda.graph(self.second, pool=self.first.pool()):
            hidden = self.x * 5  # handed the first graph's freed block
            self.out_second = hidden + 1
            del hidden
        self.streams = torch.cuda.Stream(), torch.cuda.Stream()

    def step(self, *, ordered: bool) -> tuple[float, float]:
        with track_stream_races():
            torch.cuda.synchronize()
            with torch.cuda.stream(self.streams[0]):
                self.first.replay()
            if ordered:
                self.streams[1].wait_stream(self.streams[0])
            with torch.cuda.stream(self.streams[1]):
                self.second.replay()
            torch.cuda.synchronize()
        return self.out_first[0].item(), self.out_second[0].item()


@pytest.mark.strict_races
def test_concurrent_replays_of_graphs_sharing_a_pool_race():
    overlap = Overlap()
    with pytest.raises(RaceError, match=r"(?s)replay of CUDAGraph.*test_graphs_sharing_a_pool_"
                       r"replayed_concurrently\.py.*replay of CUDAGraph"):
        overlap.step(ordered=False)
    torch.cuda.synchronize()


@pytest.mark.strict_races
def test_replays_in_capture_order_share_the_pool_cleanly():
    assert Overlap().step(ordered=True) == (3.0, 6.0)
