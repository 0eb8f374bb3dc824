"""A MoE layer captured with its shared expert on an auxiliary stream (TensorRT-LLM's and SGLang's
multi-stream MoE overlap, forked and joined inside the capture): the routed input is made on the
capturing stream, read by the shared expert on the aux stream, and dropped on the capturing stream
without `record_stream` before the routed experts allocate their scratch. The caching allocator
hands the dropped block to that scratch in the same capture: PyTorch keeps a freed block from
reuse during a capture only when another stream was recorded on it (blocks with `record_stream`
uses wait for the capture's end; PyTorch #158352's review: "memory used on a different stream is
immediately marked as reusable ... a gross correctness error",
https://github.com/pytorch/pytorch/pull/158352 ; #126809,
https://github.com/pytorch/pytorch/pull/126809). In the graph the routed experts' write and the
shared expert's read are parallel branches: every replay races, and the shared expert may read the
scratch's values. CUDA reports nothing; the emulated device's stream tracking reports the race
inside the capture, naming both ops and lines (it ran the branches in order and reported nothing
before 2026-12-06). Fixed: `hidden.record_stream(aux)` before dropping it (or the join before the
drop), and the block is not reused."""

from __future__ import annotations

import pytest
import torch

from harness.emulation import track_stream_races
from harness.emulation.tracking import RaceError

N = 1 << 12


class MoeLayer:
    def __init__(self, *, records_the_stream: bool) -> None:
        self.records = records_the_stream
        self.x = torch.arange(float(N), device="cuda")
        self.aux = torch.cuda.Stream()
        self.out = torch.zeros(1, device="cuda")
        self.graph = torch.cuda.CUDAGraph()

    def forward(self) -> None:
        main = torch.cuda.current_stream()
        hidden = self.x * 2  # the routed input
        self.aux.wait_stream(main)  # fork: the shared expert reads the input
        with torch.cuda.stream(self.aux):
            shared = hidden.sum().reshape(1)
        if self.records:
            hidden.record_stream(self.aux)
        del hidden  # dropped on the capturing stream while the aux branch still reads it
        scratch = self.x * 3  # the routed experts' scratch: same size, maybe the same block
        main.wait_stream(self.aux)  # join
        self.out.copy_(shared + scratch.sum())

    def capture_and_replay(self) -> float:
        torch.cuda.synchronize()
        with track_stream_races():
            with torch.cuda.graph(self.graph):
                self.forward()
            self.graph.replay()
            torch.cuda.synchronize()
        return self.out.item()


EXPECTED = float(sum(range(N))) * 5


@pytest.mark.strict_races
def test_the_dropped_input_reused_by_the_other_branch_is_a_race():
    with pytest.raises(RaceError, match=r"(?s)scratch = self\.x \* 3.*shared = hidden\.sum\(\)"):
        MoeLayer(records_the_stream=False).capture_and_replay()
    torch.cuda.synchronize()


@pytest.mark.strict_races
def test_the_recorded_stream_keeps_the_block_until_the_capture_ends():
    assert MoeLayer(records_the_stream=True).capture_and_replay() == EXPECTED
