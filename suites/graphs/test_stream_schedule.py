"""Stream-ordered work on a stand-in device (host tensors marked device or pinned by their
storage, as the emulated CUDA device marks them): each race caught by the tracker, and shown by the
adversarial schedule as the wrong values a loaded GPU shows, while the synchronized version of the
same code gives the right values and no report under both schedules."""

from __future__ import annotations

import pytest
import torch

from harness.emulation.device_memory import death_watch
from harness.emulation.tracking import RaceError, RaceKind
from harness.emulation.tracking.names import storage_key
from harness.emulation.tracking.work import AsyncWork

# These cases make races on purpose; report mode's RaceWarning for each is expected.
pytestmark = pytest.mark.filterwarnings("ignore::harness.emulation.tracking.RaceWarning")

MAIN, SIDE = 0, 1
EVENT = 5
SCHEDULES = ["issue_order", "adversarial"]


class StandInMemory:
    """Device and pinned memory by a mark on the storage; fresh results of device ops are device."""

    def __init__(self) -> None:
        self.call_on_device = False

    def is_device(self, t: torch.Tensor) -> bool:
        return getattr(t.untyped_storage(), "_stand_in", None) == "device"

    def is_pinned(self, t: torch.Tensor) -> bool:
        return getattr(t.untyped_storage(), "_stand_in", None) == "pinned"

    def call_targets_device(self) -> bool:
        return self.call_on_device

    def tracking_ref(self, storage: torch.UntypedStorage):
        storage._stand_in = "device"
        return death_watch(storage)


def device(t: torch.Tensor) -> torch.Tensor:
    t.untyped_storage()._stand_in = "device"
    return t


def pinned(t: torch.Tensor) -> torch.Tensor:
    t.untyped_storage()._stand_in = "pinned"
    return t


class Harness:
    def __init__(self, schedule: str, races: str = "report") -> None:
        self.current = MAIN
        memory = StandInMemory()
        self.work = AsyncWork(memory, lambda: self.current, lambda: False,
                              schedule=schedule, races=races)

    def on_device(self) -> AsyncWork:
        return self.work

    def kinds(self) -> list[RaceKind]:
        return [r.kind for r in self.work.tracker.reports]


@pytest.fixture(params=SCHEDULES)
def run(request) -> Harness:
    return Harness(request.param)


def staged_copy(h: Harness, wait: bool) -> torch.Tensor:
    staging, on_device = pinned(torch.zeros(4)), device(torch.zeros(4))
    with h.on_device():
        staging.fill_(1.0)
        on_device.copy_(staging, non_blocking=True)
        if wait:
            h.work.record_event(EVENT, MAIN)
            h.work.synchronize_event(EVENT)
        staging.fill_(2.0)  # the next step's values
        h.work.synchronize_stream(MAIN)
    return on_device


def test_pinned_staging_refilled_before_its_copy_ran(run):
    on_device = staged_copy(run, wait=False)
    assert run.kinds() == [RaceKind.HOST_WRITE_PENDING]
    report = str(run.work.tracker.reports[0])
    assert "test_stream_schedule.py" in report and "staging.fill_(2.0)" in report
    assert "on_device.copy_(staging, non_blocking=True)" in report
    expected = 2.0 if run.work.schedule.adversarial else 1.0  # the copy read the refilled buffer
    assert torch.equal(on_device, torch.full((4,), expected))


def test_pinned_staging_refilled_after_waiting(run):
    on_device = staged_copy(run, wait=True)
    assert run.kinds() == []
    assert torch.equal(on_device, torch.full((4,), 1.0))


def read_back(h: Harness, wait: bool) -> torch.Tensor:
    result, host = device(torch.full((4,), 3.0)), pinned(torch.zeros(4))
    with h.on_device():
        doubled = result * 2
        host.copy_(doubled, non_blocking=True)
        if wait:
            h.work.synchronize_stream(MAIN)
        seen = host.clone()  # the host reads the pinned buffer
    return seen


def test_pinned_result_read_before_its_copy_landed(run):
    seen = read_back(run, wait=False)
    assert run.kinds() == [RaceKind.HOST_READ_PENDING]
    assert "host.clone()" in str(run.work.tracker.reports[0])
    expected = 0.0 if run.work.schedule.adversarial else 6.0
    assert torch.equal(seen, torch.full((4,), expected))


def test_pinned_result_read_after_synchronize(run):
    assert torch.equal(read_back(run, wait=True), torch.full((4,), 6.0)) and run.kinds() == []


def side_stream(h: Harness, wait: bool) -> torch.Tensor:
    x = device(torch.ones(4))
    with h.on_device():
        x.mul_(5)  # on the main stream
        h.current = SIDE
        if wait:
            h.work.wait_stream(SIDE, MAIN)
        y = x + 1  # on the side stream
        h.current = MAIN
        h.work.wait_stream(MAIN, SIDE)
        h.work.synchronize_device()
    return y


def test_side_stream_without_wait_stream(run):
    y = side_stream(run, wait=False)
    assert run.kinds() == [RaceKind.UNSYNCHRONIZED_STREAMS]
    assert "y = x + 1" in str(run.work.tracker.reports[0]) and "x.mul_(5)" in str(run.work.tracker.reports[0])
    expected = 2.0 if run.work.schedule.adversarial else 6.0  # the side stream ran first
    assert torch.equal(y, torch.full((4,), expected))


def test_side_stream_with_wait_stream(run):
    assert torch.equal(side_stream(run, wait=True), torch.full((4,), 6.0)) and run.kinds() == []


def test_sleep_holds_its_stream_back_in_issue_order():
    h = Harness("issue_order")
    result, host = device(torch.full((2,), 4.0)), pinned(torch.zeros(2))
    with h.on_device():
        h.work.sleep(MAIN)
        host.copy_(result, non_blocking=True)
        early = host.clone()
        h.work.synchronize_stream(MAIN)
        late = host.clone()
    assert torch.equal(early, torch.zeros(2)) and torch.equal(late, torch.full((2,), 4.0))
    assert h.kinds() == [RaceKind.HOST_READ_PENDING]


@pytest.mark.parametrize("record", [False, True])
def test_freed_while_another_stream_uses_it(record):
    h = Harness("issue_order")
    with h.on_device():
        x = device(torch.ones(8)) * 2  # allocated on the main stream
        h.current = SIDE
        h.work.wait_stream(SIDE, MAIN)
        y = x.sum()
        if record:
            h.work.record_stream(x, SIDE)
        h.current = MAIN
        del x
        reused = device(torch.zeros(8)) + 3  # the main stream's next allocation: x's block
        h.work.synchronize_device()
    assert y.item() == 16.0 and reused.sum().item() == 24.0
    assert h.kinds() == ([] if record else [RaceKind.FREED_IN_USE])


def test_replay_in_flight_reads_its_static_input(run):
    static, out = device(torch.zeros(4)), device(torch.zeros(4))
    staging = pinned(torch.full((4,), 7.0))

    def replay() -> None:
        out.copy_(static * 3)

    with run.on_device():
        static.copy_(staging, non_blocking=True)
        run.work.replay(MAIN, [storage_key(static)], [storage_key(out)], replay, name="decode[bs=4]")
        staging.fill_(1.0)  # the next step's inputs, while the copy and the replay are in flight
        run.work.synchronize_stream(MAIN)
    assert run.kinds() == [RaceKind.HOST_WRITE_PENDING]
    expected = 3.0 if run.work.schedule.adversarial else 21.0
    assert torch.equal(out, torch.full((4,), expected))


def test_strict_races_raise_at_the_line():
    h = Harness("adversarial", races="strict")
    staging, on_device = pinned(torch.zeros(4)), device(torch.zeros(4))
    with pytest.raises(RaceError, match=r"shape \(4,\), torch.float32.*staging.fill_\(2.0\)"):
        with h.on_device():
            on_device.copy_(staging, non_blocking=True)
            staging.fill_(2.0)


def test_a_double_buffered_loop_is_quiet_and_right(run):
    """The fix for staged inputs: two pinned buffers, each reused only after its copy's event."""
    buffers = [pinned(torch.zeros(4)), pinned(torch.zeros(4))]
    on_device, total = device(torch.zeros(4)), device(torch.zeros(4))
    with run.on_device():
        for step in range(6):
            slot = step % 2
            if step >= 2:
                run.work.synchronize_event(EVENT + slot)
            buffers[slot].fill_(float(step))
            on_device.copy_(buffers[slot], non_blocking=True)
            run.work.record_event(EVENT + slot, MAIN)
            total.add_(on_device)
        run.work.synchronize_device()
    assert run.kinds() == []
    assert torch.equal(total, torch.full((4,), 15.0))
