"""Work inside the captured region issued on a stream the runtime made at start-up and never forked
from the capturing stream (TensorRT-LLM #12462: sends on a side stream during capture; vLLM #53818,
RWKV lightning #24: kernels launched on a stream other than the capture's). CUDA captures only the
capturing stream and the streams that waited on it: the side stream's kernel runs once, at capture,
and never at replay. Left unjoined too, nothing is refused and the replayed step's output differs
from the eager step's, on CUDA and on the emulated device alike. Joined without the fork, CUDA
refuses the join (test_capture_waits_on_uncaptured_work.py). Fixed: fork the side stream from the
capturing stream (`wait_stream`) and join it back.

On a GPU this file runs on CUDA itself, not in the graph sanitizer the other miniatures use there:
the sanitizer's captures are emulated, and until 2026-12-06 they recorded every stream's work, so
its replay ran the side kernel too and equalled eager (what the H200 runs of 2026-12-01/02 saw;
docs/fidelity.md).
scripts/unforked_stream_probe.py prints CUDA's facts (the side stream does not report capturing;
its kernel writes at capture; the replay leaves it out)."""

from __future__ import annotations

import pytest
import torch

import harness
from harness.emulation import emulation_active


# CUDA where there is one, else the emulated device (conftest.py)
RUNS_NATIVELY_ON_A_GPU = True


class Runner:
    def __init__(self, *, fork_and_join: bool) -> None:
        self.fork_and_join = fork_and_join
        self.side = torch.cuda.Stream()  # made once, before any capture
        # torch.cuda.Stream() hands out one of 32 pooled CUDA streams per priority: in a process
        # that made many, a new one can be the side stream itself, which would then be captured.
        self.capture_stream = torch.cuda.Stream()
        while self.capture_stream.cuda_stream == self.side.cuda_stream:
            self.capture_stream = torch.cuda.Stream()
        self.hidden = torch.zeros(8, device="cuda")
        self.scaled = torch.zeros(8, device="cuda")
        self.out = torch.zeros(8, device="cuda")
        self.graph = torch.cuda.CUDAGraph()

    def step(self) -> None:
        if self.fork_and_join:
            self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            torch.mul(self.hidden, 2, out=self.scaled)  # no allocation on the side stream
        if self.fork_and_join:
            torch.cuda.current_stream().wait_stream(self.side)
        torch.add(self.scaled, 1, out=self.out)

    def capture(self) -> None:
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph, stream=self.capture_stream):
            self.step()
        torch.cuda.synchronize()

    def replay(self, hidden: list[float]) -> list[float]:
        self.hidden.copy_(torch.tensor(hidden))
        self.graph.replay()
        torch.cuda.synchronize()
        return self.out.tolist()


def _eager(hidden: list[float]) -> list[float]:
    return [2 * h + 1 for h in hidden]


def test_the_unforked_stream_is_left_out_of_the_graph():
    if emulation_active() == "cuda":
        pytest.skip("the graph sanitizer records every stream's work during a capture, the side "
                    "stream's too (docs/fidelity.md, known differences)")
    runner = Runner(fork_and_join=False)
    runner.capture()
    hidden = [float(i) for i in range(8)]
    assert runner.replay(hidden) != _eager(hidden)  # the side stream's kernel never replays
    assert runner.replay(hidden) == [1.0] * 8  # the graph adds 1 to what the capture left


def test_the_forked_and_joined_stream_replays_with_the_graph():
    runner = Runner(fork_and_join=True)
    runner.capture()
    hidden = [float(i) for i in range(8)]
    assert runner.replay(hidden) == _eager(hidden)
