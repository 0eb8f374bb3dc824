"""Stream-order mistakes of an overlapped replay loop, in the forms serving loops write them: an
event recorded once and reused as if it marked every later replay (SGLang #31686, the "read done"
fence); one pinned staging buffer refilled on the host before its non_blocking copy ran (vLLM
#24527); an input freed on the main stream while a side stream still reads it, without
`record_stream` (SGLang #18744). Each buggy loop is a RaceError naming the op and this file's line;
the fixed loop (an event recorded after each replay, the staging buffer refilled after its copy's
event,
`record_stream`) passes with the right values."""

from __future__ import annotations

import pytest
import torch

from harness.emulation import emulation_active, track_stream_races
from harness.emulation.tracking import RaceError

STEPS = 3


def _graph(x: torch.Tensor, out: torch.Tensor) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out.copy_(x * 2)
    return graph


def event_per_replay(*, record_every_step: bool) -> list[float]:
    side = torch.cuda.Stream()
    x, out = torch.zeros(8, device="cuda"), torch.zeros(8, device="cuda")
    graph, done = _graph(x, out), torch.cuda.Event()
    sums = []
    for step in range(STEPS):
        x.fill_(float(step))
        graph.replay()
        if record_every_step or step == 0:
            done.record()
        with torch.cuda.stream(side):
            side.wait_event(done)
            sums.append(out.sum())
        torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    return [float(s) for s in sums]


def staged_copies(*, wait_before_refill: bool) -> list[float]:
    staging = torch.empty(8, pin_memory=True)
    copied = torch.cuda.Event()
    sums = []
    for step in range(STEPS):
        if wait_before_refill and step:
            copied.synchronize()
        staging.fill_(float(step))
        device = staging.to("cuda", non_blocking=True)
        copied.record()
        sums.append(device.sum())
    torch.cuda.synchronize()
    return [float(s) for s in sums]


def side_stream_frees(side: torch.cuda.Stream, out: torch.Tensor, *, record_stream: bool) -> float:
    hidden = torch.full((8,), 2.0, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out.copy_(hidden * 2)
    if record_stream:
        hidden.record_stream(side)
    del hidden
    taken = torch.full((8,), 5.0, device="cuda")  # the main stream's next allocation
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    del taken
    return float(out.sum())


@pytest.mark.strict_races
def test_an_event_recorded_once_and_reused_for_later_replays_is_a_race():
    with track_stream_races(), pytest.raises(RaceError, match="test_stream_order_in_a_replay_loop.py"):
        event_per_replay(record_every_step=False)


@pytest.mark.strict_races
def test_an_event_recorded_after_every_replay_orders_the_reader():
    with track_stream_races():
        assert event_per_replay(record_every_step=True) == [2.0 * 8 * step for step in range(STEPS)]


@pytest.mark.strict_races
def test_one_pinned_staging_buffer_refilled_before_its_copy_ran_is_a_race():
    if emulation_active() != "cpu":
        # Over a real GPU, track_stream_races() is a CSAN-like mode that sees CUDA tensors only,
        # not the host's writes of pinned memory.
        pytest.skip("host accesses of pinned memory are tracked on the emulated device only")
    with track_stream_races(), pytest.raises(RaceError, match=r"host write[\s\S]*test_stream_order"):
        staged_copies(wait_before_refill=False)


@pytest.mark.strict_races
def test_a_staging_buffer_refilled_after_its_copys_event_is_clean():
    with track_stream_races():
        assert staged_copies(wait_before_refill=True) == [8.0 * step for step in range(STEPS)]


@pytest.mark.strict_races
def test_an_input_freed_while_a_side_stream_reads_it_is_a_race():
    if emulation_active() != "cpu":
        # Over a real GPU the CSAN-like mode sees the ops on CUDA tensors, not the allocator's frees
        # (harness/emulation/tracking/real_streams.py).
        pytest.skip("frees are tracked on the emulated device only")
    side, out = torch.cuda.Stream(), torch.zeros(8, device="cuda")
    with track_stream_races():
        with pytest.raises(RaceError, match=r"freed[\s\S]*del hidden[\s\S]*hidden \* 2"):
            side_stream_frees(side, out, record_stream=False)
        torch.cuda.synchronize()  # the loop aborted before its join; out is the side stream's


@pytest.mark.strict_races
def test_record_stream_keeps_the_input_until_the_side_stream_is_done():
    with track_stream_races():
        assert side_stream_frees(torch.cuda.Stream(), torch.zeros(8, device="cuda"),
                                 record_stream=True) == 32.0
