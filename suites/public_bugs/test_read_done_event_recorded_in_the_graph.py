"""The write-after-read fence of an overlap scheduler (SGLang #28843, #31686, #36335): the next
batch's page table is written on a scheduler stream while the current batch's graph replays, and
the writer must wait until the graph has read the table. The graph's fused metadata op re-reads
the table at every replay, so the "read done" event has to be a node of the graph: made with
`external=True` and recorded inside the capture after the last read, CUDA records it again at each
replay when the work before it ran (cudaEventRecordExternal). Buggy: the event recorded before
replay (SGLang's fence before #31686), or inside the graph ahead of the op that still reads the
table; the scheduler's write then races with the replay's read: a `RaceError` naming the write and
the replay. Fixed: recorded after the read, the write waits for it and the results are right.
Until 2026-12-06 the harness reported the fixed fence too (an event recorded inside a capture was
never recorded again at replay, so the wait ordered nothing)."""

from __future__ import annotations

import pytest
import torch

from harness.emulation import emulation_active, track_stream_races
from harness.emulation.tracking import RaceError

STEPS = 3


def _needs_the_emulated_device() -> None:
    # The graph sanitizer replays on real streams without recording the graph's event nodes,
    # and race tracking over real streams does not see replays (docs/fidelity.md).
    if emulation_active() != "cpu":
        pytest.skip("graph event nodes and replays are tracked on the emulated device only")


class OverlapRunner:
    """A decode graph reading `page_table` twice (the gather, then a fused metadata op), and a
    scheduler stream writing the next batch's table while the replay runs."""

    def __init__(self, fence: str) -> None:
        self.fence = fence  # "after_last_read", "between_reads" or "before_replay"
        self.scheduler = torch.cuda.Stream()
        self.page_table = torch.arange(8.0, device="cuda")
        self.kv = torch.zeros(8, device="cuda")
        self.out = torch.zeros(8, device="cuda")
        self.read_done = torch.cuda.Event(external=True)
        self.graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph):
            self.kv.copy_(self.page_table * 2)  # the gather reads the table
            if fence == "between_reads":
                self.read_done.record()
            self.out.copy_(self.kv + self.page_table)  # the fused metadata op re-reads it
            if fence == "after_last_read":
                self.read_done.record()

    def run(self) -> list[float]:
        sums = []
        for step in range(STEPS):
            if self.fence == "before_replay":
                self.read_done.record()
            self.graph.replay()
            self.scheduler.wait_event(self.read_done)
            with torch.cuda.stream(self.scheduler):
                self.page_table.fill_(float(step))  # the next batch's table
            torch.cuda.current_stream().wait_stream(self.scheduler)
            sums.append(self.out.sum())
        torch.cuda.synchronize()
        return [float(s) for s in sums]


@pytest.mark.strict_races
@pytest.mark.parametrize("fence", ["between_reads", "before_replay"])
def test_a_fence_before_the_last_read_of_the_table_is_a_race(fence):
    _needs_the_emulated_device()
    with pytest.raises(RaceError, match="test_read_done_event_recorded_in_the_graph.py") as caught:
        with track_stream_races():
            OverlapRunner(fence).run()
    text = str(caught.value)
    assert "aten.fill_" in text and "replay of CUDAGraph" in text


@pytest.mark.strict_races
def test_the_event_node_after_the_last_read_fences_the_write():
    _needs_the_emulated_device()
    with track_stream_races():
        sums = OverlapRunner("after_last_read").run()
    # step 0 reads arange(8): 3 * 28; then the table written at the step before: 3 * 8 * value
    assert sums == [84.0, 0.0, 24.0]
