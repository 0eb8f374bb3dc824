"""A graph runner that synchronizes the stream it captured on, believing that waits for the replay
(XPU-Forces xpu_graph #491, "ensure stream sync after graph replay": `self._stream.synchronize()`
after `self._graph.replay()`, where the replay had gone to the current stream, not the capture
stream). `CUDAGraph.replay()` launches on the current stream; the capture stream has nothing queued,
so its synchronize returns at once and the caller, told the output is ready, reads it on a stream of
its own (a sampler's) while the replay still writes it. On CUDA the sampler reads stale or partial
logits, silently; the harness's stream tracking reports the race, naming the replay and the read.
Fixed: the runner replays on the stream it synchronizes (ordered after the input copy)."""

from __future__ import annotations

import pytest
import torch

from harness.emulation import emulation_active, track_stream_races
from harness.emulation.tracking import RaceError

SIZE = 1 << 12


class GraphRunner:
    def __init__(self, *, replay_on_own_stream: bool) -> None:
        self.replay_on_own_stream = replay_on_own_stream
        self.stream = torch.cuda.Stream()  # the stream this runner captures on
        self.static_input = torch.zeros(SIZE, device="cuda")
        self.graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph, stream=self.stream):
            self.static_output = self.static_input * 2 + 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The output, ready for any stream once this returns (the runner's promise)."""
        if self.replay_on_own_stream:
            self.stream.wait_stream(torch.cuda.current_stream())  # x was made on the caller's
            with torch.cuda.stream(self.stream):
                self.static_input.copy_(x)
                self.graph.replay()
        else:
            self.static_input.copy_(x)
            self.graph.replay()  # goes to the current stream
        self.stream.synchronize()
        return self.static_output


def _sampled(*, replay_on_own_stream: bool) -> float:
    runner = GraphRunner(replay_on_own_stream=replay_on_own_stream)
    sampler = torch.cuda.Stream()
    torch.cuda.synchronize()
    with track_stream_races():
        logits = runner.forward(torch.full((SIZE,), 3.0, device="cuda"))
        with torch.cuda.stream(sampler):  # no wait: forward said the output is ready
            best = logits.max()
        sampler.synchronize()
        return best.item()


@pytest.mark.strict_races
def test_synchronizing_the_capture_stream_leaves_the_replay_racing_the_reader():
    with pytest.raises(RaceError, match="test_synchronized_the_capture_stream_not_the_replay.py") \
            as caught:
        _sampled(replay_on_own_stream=False)
    if emulation_active() == "cpu":
        # the emulated device sees the replay as one stream op; natively the race tracker sees
        # the torch calls around a real graph only and names the copy into its input (H100,
        # 2026-12-06)
        assert "replay of CUDAGraph" in str(caught.value), caught.value
    assert "logits.max()" in str(caught.value), caught.value


@pytest.mark.strict_races
def test_a_replay_on_the_synchronized_stream_is_done_when_forward_returns():
    assert _sampled(replay_on_own_stream=True) == 7.0
