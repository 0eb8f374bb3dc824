"""The stream tracker on synthetic stream, event and storage ids, as PyTorch's own stream
sanitizer tests drive its detector: each rule shown catching its race and staying quiet once the
accesses are ordered."""

from __future__ import annotations

import pytest
import torch

from harness.emulation.tracking import HOST, RaceError, RaceKind, StreamTracker, TensorLabel
from harness.emulation.tracking.names import name_tensors, storage_key
from harness.emulation.tracking.races import Access

# These cases make races on purpose; report mode's RaceWarning for each is expected.
pytestmark = pytest.mark.filterwarnings("ignore::harness.emulation.tracking.RaceWarning")

S0, S1, S2 = 0, 1, 2
A, B, C = 100, 200, 300  # storages
E = 7  # an event


@pytest.fixture
def tracker() -> StreamTracker:
    return StreamTracker(mode="report")


def kinds(tracker: StreamTracker) -> list[RaceKind]:
    return [r.kind for r in tracker.reports]


def test_same_stream_is_ordered(tracker):
    tracker.launch(S1, writes=[A])
    tracker.launch(S1, reads=[A], writes=[B])
    tracker.launch(S1, reads=[B], writes=[A])
    assert tracker.reports == []


def test_read_on_another_stream_after_write_races(tracker):
    tracker.launch(S1, writes=[A], op="fill_", where="a.py:1: x.fill_(1)")
    tracker.launch(S2, reads=[A], writes=[B], op="add", where="a.py:2: y = x + 1")
    assert kinds(tracker) == [RaceKind.UNSYNCHRONIZED_STREAMS]
    report = tracker.reports[0]
    assert (report.current.participant, report.previous.participant) == (S2, S1)
    assert "a.py:1" in str(report) and "a.py:2" in str(report)


def test_write_after_read_on_another_stream_races(tracker):
    tracker.launch(S1, reads=[A], writes=[B])
    tracker.launch(S2, writes=[A])
    assert kinds(tracker) == [RaceKind.UNSYNCHRONIZED_STREAMS]


def test_reads_on_two_streams_do_not_race(tracker):
    tracker.launch(S1, reads=[A], writes=[B])
    tracker.launch(S2, reads=[A], writes=[C])
    assert tracker.reports == []


def test_event_orders_streams(tracker):
    tracker.launch(S1, writes=[A])
    tracker.record_event(E, S1)
    tracker.wait_event(S2, E)
    tracker.launch(S2, reads=[A], writes=[B])
    assert tracker.reports == []


def test_event_recorded_before_the_write_does_not_order_it(tracker):
    tracker.record_event(E, S1)
    tracker.launch(S1, writes=[A])
    tracker.wait_event(S2, E)
    tracker.launch(S2, reads=[A])
    assert kinds(tracker) == [RaceKind.UNSYNCHRONIZED_STREAMS]


def test_wait_stream_orders_and_is_transitive(tracker):
    tracker.launch(S0, writes=[A])
    tracker.wait_stream(S1, S0)
    tracker.launch(S1, reads=[A], writes=[B])
    tracker.wait_stream(S2, S1)
    tracker.launch(S2, reads=[A, B], writes=[C])
    assert tracker.reports == []


def test_wait_stream_is_not_symmetric(tracker):
    tracker.launch(S1, writes=[A])
    tracker.wait_stream(S1, S2)  # the wrong way round
    tracker.launch(S2, reads=[A])
    assert kinds(tracker) == [RaceKind.UNSYNCHRONIZED_STREAMS]


def test_host_sync_orders_every_later_launch(tracker):
    tracker.launch(S1, writes=[A])
    tracker.synchronize_device()
    tracker.launch(S2, reads=[A])
    tracker.launch(S0, reads=[A])
    assert tracker.reports == []
    tracker.launch(S0, writes=[A])  # S2's read is not waited for
    assert kinds(tracker) == [RaceKind.UNSYNCHRONIZED_STREAMS]


def test_pinned_source_rewritten_before_its_copy_ran(tracker):
    # staging.copy_(...) on the host; dev.copy_(staging, non_blocking=True) on S1; host rewrites staging
    tracker.launch(S1, reads=[A], writes=[B], op="copy_ (non_blocking)", where="loop.py:10")
    tracker.host_write(A, op="copy_ on the host", where="loop.py:12")
    assert kinds(tracker) == [RaceKind.HOST_WRITE_PENDING]
    assert "loop.py:10" in str(tracker.reports[0]) and "loop.py:12" in str(tracker.reports[0])


@pytest.mark.parametrize("wait", ["stream", "event", "device"])
def test_pinned_source_rewritten_after_waiting(tracker, wait):
    tracker.launch(S1, reads=[A], writes=[B])
    tracker.record_event(E, S1)
    {"stream": lambda: tracker.synchronize_stream(S1),
     "event": lambda: tracker.synchronize_event(E),
     "device": tracker.synchronize_device}[wait]()
    tracker.host_write(A)
    assert tracker.reports == []


def test_synchronizing_another_stream_does_not_order_the_copy(tracker):
    tracker.launch(S1, reads=[A], writes=[B])
    tracker.synchronize_stream(S2)
    tracker.host_write(A)
    assert kinds(tracker) == [RaceKind.HOST_WRITE_PENDING]


def test_pinned_destination_read_before_its_copy_was_waited_for(tracker):
    tracker.launch(S1, reads=[B], writes=[A], op="copy_ (non_blocking, to pinned)")
    tracker.host_read(A, op="tolist")
    assert kinds(tracker) == [RaceKind.HOST_READ_PENDING]
    tracker.reports.clear()
    tracker.synchronize_stream(S1)
    tracker.host_read(A)
    assert tracker.reports == []


def test_host_access_before_a_launch_is_ordered(tracker):
    tracker.host_write(A)
    tracker.launch(S1, reads=[A], writes=[B])
    tracker.synchronize_stream(S1)
    tracker.host_write(A)
    tracker.host_read(B)
    assert tracker.reports == []


def test_untouched_host_memory_has_nothing_pending(tracker):
    tracker.host_write(C)
    tracker.host_read(C)
    assert tracker.reports == []


def test_replay_in_flight_reads_its_static_input(tracker):
    # a graph replay is one launch over every storage its recording reads and writes
    tracker.launch(S1, reads=[A, B], writes=[C], op="replay of decode[bs=4]")
    tracker.host_write(A, op="next step's inputs")
    assert kinds(tracker) == [RaceKind.HOST_WRITE_PENDING]
    assert "replay of decode[bs=4]" in str(tracker.reports[0])


D = 400  # a storage allocated after a free: perhaps made of the freed block


def _freed_while_s1_reads(tracker: StreamTracker) -> None:
    tracker.launch(S0, writes=[A])             # allocated and filled on S0
    tracker.wait_stream(S1, S0)
    tracker.launch(S1, reads=[A], writes=[B], op="sum", where="m.py:3: total = a.sum()")
    tracker.free(A, allocation_stream=S0, nbytes=64, where="m.py:4: del a")


def test_a_free_alone_is_no_race(tracker):
    # The block goes back to S0's pool: nothing touches it until S0 allocates again.
    _freed_while_s1_reads(tracker)
    assert tracker.reports == []


def test_memory_reused_on_the_freeing_stream_before_the_read_is_waited_for_races(tracker):
    _freed_while_s1_reads(tracker)
    tracker.allocate(D, S0, nbytes=64)
    tracker.launch(S0, writes=[D], op="fill_", where="m.py:5: reused.fill_(7)")
    assert kinds(tracker) == [RaceKind.FREED_IN_USE]
    text = str(tracker.reports[0])
    assert "del a" in text and "reused.fill_(7)" in text and "total = a.sum()" in text, text
    assert "on stream 1" in text and "on stream 0" in text, text


@pytest.mark.parametrize("order", ["record_stream", "wait_stream", "wait_event", "synchronize",
                                   "wait_stream after the free", "synchronize after the free"])
def test_memory_reused_after_ordering_is_quiet(tracker, order):
    tracker.launch(S0, writes=[A])
    tracker.wait_stream(S1, S0)
    tracker.launch(S1, reads=[A], writes=[B])
    tracker.record_event(E, S1)
    before, after = order.split(" after the free")[0], "after the free" in order
    make_order = {"record_stream": lambda: tracker.record_stream(A, S1),
                  "wait_stream": lambda: tracker.wait_stream(S0, S1),
                  "wait_event": lambda: tracker.wait_event(S0, E),
                  "synchronize": tracker.synchronize_device}[before]
    if not after:
        make_order()
    tracker.free(A, allocation_stream=S0)
    if after:
        make_order()
    tracker.allocate(D, S0, nbytes=1)
    tracker.launch(S0, writes=[D])
    assert tracker.reports == []


def test_an_allocation_touched_only_after_the_wait_is_quiet(tracker):
    # `torch.empty` on S0, then S0 waits for the reader, then the first write: what CUDA runs.
    _freed_while_s1_reads(tracker)
    seq = tracker.launch(S0)
    tracker.allocate(D, S0, nbytes=64)
    tracker.record_fresh(D, Access(True, S0, seq, "empty", ""), touched=False)
    tracker.wait_stream(S0, S1)
    tracker.launch(S0, writes=[D], op="fill_")
    assert tracker.reports == []


def test_the_other_pool_never_gets_the_block(tracker):
    # A freed small-pool block (up to 1 MiB) is never handed to a large-pool request.
    _freed_while_s1_reads(tracker)
    tracker.allocate(D, S0, nbytes=4 << 20)
    tracker.launch(S0, writes=[D])
    tracker.allocate(C, S1, nbytes=64)  # another stream's pool
    tracker.launch(S1, writes=[C])
    assert tracker.reports == []


def test_a_freed_storage_is_reported_under_its_label_and_then_forgets_it(tracker):
    # The next tensor at a freed address is another tensor: a race on it must not be reported
    # under the freed one's shape and dtype (the emulated device keys storages by address).
    tracker.labels[A] = TensorLabel((1, 64), "torch.bfloat16", "")
    tracker.launch(S0, writes=[A])
    tracker.wait_stream(S1, S0)
    tracker.launch(S1, reads=[A], writes=[B])
    tracker.free(A, allocation_stream=S0, nbytes=128)
    tracker.launch(S1, writes=[A], op="copy_")  # the address taken by a pinned buffer
    tracker.host_read(A, op="tolist")
    tracker.allocate(D, S0, nbytes=128)
    tracker.labels[D] = TensorLabel((2,), "torch.float32", "")
    tracker.launch(S0, writes=[D])
    assert kinds(tracker) == [RaceKind.HOST_READ_PENDING, RaceKind.FREED_IN_USE]
    assert "torch.bfloat16" not in str(tracker.reports[0])
    assert "(shape (1, 64), torch.bfloat16)" in str(tracker.reports[1])
    assert "(shape (2,), torch.float32)" in str(tracker.reports[1])


@pytest.mark.parametrize("between", ["nothing", "a tracked host write"])
def test_a_queued_copy_finding_its_pinned_input_changed_reports_an_unseen_host_write(tracker, between):
    seq = tracker.launch(S0, reads=[A], writes=[B], op="copy_", where="m.py:1: flat.copy_(staging)")
    issued = tracker.writes_so_far(A)
    if between == "a tracked host write":
        tracker.host_write(A, op="fill_")  # reported itself: the copy's check must not repeat it
    read = Access(False, S0, seq, "copy_", "m.py:1: flat.copy_(staging)")
    tracker.unseen_host_write(A, read, issued)
    assert kinds(tracker) == [RaceKind.HOST_WRITE_PENDING]
    assert ("no dispatcher saw" in str(tracker.reports[0])) == (between == "nothing")


def test_strict_mode_raises_with_the_report():
    strict = StreamTracker()
    strict.labels[A] = TensorLabel((4, 8), "torch.float32", "engine.staging")
    strict.launch(S1, reads=[A], writes=[B])
    with pytest.raises(RaceError, match=r"engine.staging \(shape \(4, 8\), torch.float32\)") as info:
        strict.host_write(A)
    assert info.value.report.kind is RaceKind.HOST_WRITE_PENDING


def test_mode_is_checked():
    with pytest.raises(ValueError, match="mode='loud'; accepted: strict, report"):
        StreamTracker(mode="loud")


def test_host_id_is_not_a_stream(tracker):
    with pytest.raises(ValueError, match="host"):
        tracker.launch(HOST, writes=[A])


def test_labels_name_tensors_by_path():
    class Engine:
        def __init__(self):
            self.staging = torch.zeros(4, 2, dtype=torch.int32)
            self.buffers = {"positions": torch.zeros(3)}

    engine = Engine()
    labels = name_tensors(engine, "engine")
    assert str(labels[storage_key(engine.staging)]) == "tensor engine.staging (shape (4, 2), torch.int32)"
    assert labels[storage_key(engine.buffers["positions"])].path == "engine.buffers['positions']"
