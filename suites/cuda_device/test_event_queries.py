"""`Stream.query()` and `Event.query()` as CUDA answers them: False while the work they cover has
not run (held back by `torch.cuda._sleep`, or queued by the adversarial schedule), True once it
has, and a True answer is a synchronization: the host (and work it issues afterwards, on any
stream) is ordered after that work, so a polling loop's read is no race. `elapsed_time` queries
both events first, as torch's CUDAEvent does. The same checks run natively on a GPU and in the
graph sanitizer, with the race tracker over the real streams."""

from __future__ import annotations

import threading

import pytest
import torch

import harness
from harness.emulation import track_stream_races
from harness.emulation.tracking import RaceWarning

SLEEP_CYCLES = 50_000_000  # tens of milliseconds on a GPU: the host polls long before it ends
# Half a second on a GPU, for a check that the work is not done yet: a host of eight pytest
# workers sharing the GPU was once more than tens of milliseconds from the launch to its first
# query (H200, 2026-12-07). The emulated device's sleep costs no wall time.
HELD_BACK_CYCLES = 1_000_000_000
# About 0.1 s on a GPU: three queries in a row inside it, yet a polling loop over it stays short
# on the emulated device (20,000 polls). 50M cycles was too short for three natively (H100, eight
# workers, 2026-12-07).
THREE_POLLS_CYCLES = 200_000_000


def _produce_on_a_side_stream(x: torch.Tensor, *, stall: bool, cycles: int = SLEEP_CYCLES):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        if stall:
            torch.cuda._sleep(cycles)
        y = x * 2
        done = torch.cuda.Event()
        done.record()
    return side, y, done


@pytest.mark.parametrize("poll", ["event", "stream"])
def test_work_a_query_saw_done_is_ordered_before_later_work_on_any_stream(cuda_kind, poll):
    with track_stream_races():
        x = torch.ones(8, device="cuda")
        side, y, done = _produce_on_a_side_stream(x, stall=False)
        target = done if poll == "event" else side
        while not target.query():
            pass
        z = y + 1  # the main stream, no wait_stream: the host saw the side stream's work done
        assert z.tolist() == [3.0] * 8


def test_a_query_answers_false_while_a_sleep_holds_the_work_back(cuda_kind):
    with track_stream_races():
        x = torch.ones(8, device="cuda")
        side, y, done = _produce_on_a_side_stream(x, stall=True, cycles=HELD_BACK_CYCLES)
        assert not done.query() and not side.query()
        done.synchronize()
        assert done.query() and side.query()
        assert y.tolist() == [2.0] * 8


@pytest.mark.parametrize("poll", ["event", "stream"])
def test_a_long_sleep_outlasts_polls_in_a_row_and_a_polling_loop_still_ends(cuda_kind, poll):
    # tens of milliseconds of spinning: a host asking three times in a row finds it busy each
    # time (PyTorch's test_streams_multi_gpu_query and test_events_multi_gpu_query ask so)
    with track_stream_races():
        x = torch.ones(8, device="cuda")
        side, y, done = _produce_on_a_side_stream(x, stall=True, cycles=THREE_POLLS_CYCLES)
        target = done if poll == "event" else side
        assert [target.query() for _ in range(3)] == [False, False, False]
        polls = 3
        while not target.query():
            polls += 1
        assert polls > 3
        assert y.tolist() == [2.0] * 8  # read after a True answer: no race


def test_a_sleeps_cycles_show_in_the_event_time_around_it(cuda_kind):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(SLEEP_CYCLES)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 20.0  # 50M cycles at a 2 GHz clock or slower: 25 ms or more


def test_elapsed_time_of_events_still_pending_is_refused(cuda_kind):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(SLEEP_CYCLES)
    end.record()
    # torch checks both events with query(); a build without that check gets CUDA's own answer.
    with pytest.raises(RuntimeError, match="must be completed|not ready"):
        start.elapsed_time(end)
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0


def test_a_polling_loop_ends_under_the_adversarial_schedule(outside_emulation):
    with harness.emulate_cuda(device="cpu", schedule="adversarial", races="strict"):
        x = torch.ones(8, device="cuda")
        on_host = torch.empty(8, pin_memory=True)
        on_host.copy_(x * 3, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        polls = 1
        while not copied.query():  # the queued copy runs after the first answer, as a GPU gets to it
            polls += 1
        assert polls == 2
        assert on_host.tolist() == [3.0] * 8  # read after a True answer: no race, no poison


def test_an_event_node_of_a_graph_is_recorded_at_each_replay(outside_emulation):
    """`Event(external=True)` recorded inside a capture is a node of the graph: a stream waiting on
    it after a replay is ordered after the work captured before it, not after the rest."""
    with pytest.warns(RaceWarning), \
            harness.emulate_cuda(device="cpu", schedule="adversarial", races="report") as state:
        table, out = torch.arange(4.0, device="cuda"), torch.zeros(4, device="cuda")
        scratch = torch.zeros(4, device="cuda")
        read_done = torch.cuda.Event(external=True)
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            scratch.copy_(table + 1)  # the only read of `table`
            read_done.record()
            out.copy_(scratch * 2)
        writer = torch.cuda.Stream()
        graph.replay()
        writer.wait_event(read_done)
        with torch.cuda.stream(writer):
            table.fill_(0.0)
            out.fill_(-1.0)  # written after the node only: the replay's later write races
        torch.cuda.synchronize()
        reports = state.streams_tracking.reports
    assert len(reports) == 1, [str(r) for r in reports]
    assert "out.fill_(-1.0)" in reports[0].current.where
    assert reports[0].previous.op.startswith("replay of CUDAGraph")


@pytest.mark.parametrize("use", ["query", "synchronize", "wait_event"])
def test_an_event_last_recorded_in_a_finished_capture_is_an_invalid_argument(cuda_kind, use):
    """Its record went into the graph (not an external event, which each replay records): CUDA
    answers "invalid argument" to its use after the capture (measured on an H100, torch 2.11); a
    record after the capture makes it usable again."""
    if cuda_kind == "sanitizer":
        pytest.skip("the sanitizer's events are recorded for real during its capture")
    x = torch.ones(4, device="cuda")
    event = torch.cuda.Event()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.mul_(2)
        event.record()
    graph.replay()
    uses = {"query": event.query, "synchronize": event.synchronize,
            "wait_event": lambda: torch.cuda.current_stream().wait_event(event)}
    with pytest.raises(torch.AcceleratorError, match="invalid argument"):
        uses[use]()
    event.record()
    event.synchronize()
    assert event.query() and x.tolist() == [2.0] * 4


def test_an_events_handle_is_zero_until_its_first_record(cuda_kind):
    # CUDA creates the event at its first record (PyTorch's test_events).
    event = torch.cuda.Event(enable_timing=True)
    assert event.cuda_event == 0
    assert event.event_id == 0
    event.record()
    assert event.cuda_event != 0
    assert event.event_id == event.cuda_event
    event.synchronize()


def test_an_interprocess_event_with_timing_is_refused_where_cuda_makes_it(cuda_kind):
    """cudaEventInterprocess needs cudaEventDisableTiming: torch makes the event at its first
    record with both flags as asked, and cudaEventCreateWithFlags answers "invalid argument"
    (scripts/fourth_sweep_probe.py prints CUDA's answer). Without timing it records as any."""
    timed = torch.cuda.Event(enable_timing=True, interprocess=True)
    with pytest.raises(torch.AcceleratorError, match="invalid argument"):
        timed.record()
    shared = torch.cuda.Event(interprocess=True)
    shared.record()
    shared.synchronize()
    assert shared.query()


def test_joining_a_thread_that_waited_for_a_sleep_moves_the_joiners_clock_on(cuda_kind):
    # Each host thread keeps its own event-timing clock on the emulated device (device_clock.py);
    # a join is the hand-off it sees: the joiner goes on from when the joined thread's wait ended.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()

    def sleeps_and_waits() -> None:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            torch.cuda._sleep(400_000_000)  # about 200 ms on its own stream
        stream.synchronize()

    worker = threading.Thread(target=sleeps_and_waits)
    worker.start()
    worker.join()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 160.0
