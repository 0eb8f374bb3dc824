"""The order in which the adversarial schedule runs queued work (tracking/schedule.py): on one
stream, issue order; across streams that never waited for each other, the most recently issued
ready head first; a queued wait holds its stream until the work it waits for ran."""

from __future__ import annotations

from harness.emulation.tracking.schedule import Schedule


def _queue(schedule: Schedule, ran: list, stream: int, seq: int) -> None:
    schedule.queue(stream, seq, lambda: ran.append((stream, seq)))


def test_one_stream_runs_its_queue_in_issue_order():
    schedule, ran = Schedule("adversarial"), []
    for seq in range(1, 6):
        _queue(schedule, ran, 0, seq)
    schedule.synchronize_device()
    assert ran == [(0, 1), (0, 2), (0, 3), (0, 4), (0, 5)]
    assert not schedule.pending(0) and not schedule.queued(0, 5)


def test_one_stream_runs_up_to_what_the_host_waits_for():
    schedule, ran = Schedule("adversarial"), []
    for seq in range(1, 5):
        _queue(schedule, ran, 0, seq)
    schedule.record_event(7, 0)
    _queue(schedule, ran, 0, 5)
    schedule.run_stream(0, 3)
    assert ran == [(0, 1), (0, 2), (0, 3)]
    assert schedule.queued(0, 4) and schedule.queued(0, 5)
    schedule.synchronize_event(7)
    assert ran[3:] == [(0, 4)] and schedule.queued(0, 5)


def test_streams_that_never_waited_run_the_latest_ready_head_first():
    schedule, ran = Schedule("adversarial"), []
    for stream, seq in ((1, 1), (2, 2), (1, 3), (2, 4)):
        _queue(schedule, ran, stream, seq)
    schedule.synchronize_device()
    # heads 1 and 2: 2 runs; heads 1 and 4: 4; then stream 1 alone, in its order
    assert ran == [(2, 2), (2, 4), (1, 1), (1, 3)]


def test_a_queued_wait_holds_its_stream_until_the_other_ran():
    schedule, ran = Schedule("adversarial"), []
    _queue(schedule, ran, 1, 1)
    _queue(schedule, ran, 1, 2)
    schedule.wait_stream(2, 1)  # stream 2 waits for all of stream 1's work so far
    _queue(schedule, ran, 2, 3)
    _queue(schedule, ran, 1, 4)
    schedule.run_stream(2)
    # stream 2's wait runs stream 1 up to 2 first; stream 1's later op is not waited for
    assert ran == [(1, 1), (1, 2), (2, 3)]
    assert schedule.queued(1, 4)


def test_a_stall_on_a_lone_stream_holds_nothing_back_at_a_synchronize():
    schedule, ran = Schedule("issue_order"), []
    schedule.stall(0, 1, cycles=10**9)  # torch.cuda._sleep: the stream's later work queues
    _queue(schedule, ran, 0, 2)
    _queue(schedule, ran, 0, 3)
    assert schedule.defers(0) and not ran
    schedule.synchronize_device()
    assert ran == [(0, 2), (0, 3)] and not schedule.pending(0)
