"""Races between streams and the host, as contract cases: each written once against torch.cuda,
run natively on a GPU (the racing stream stalled with torch.cuda._sleep after a warmup, so the
race shows every time) and on the emulated CUDA device under both schedules. The racy version
gives the same wrong value everywhere it can and the emulator's tracker names the race (the
tensor and both lines); the synchronized version gives the right value and no report.

    pytest suites/graphs/test_stream_races.py -m gpu   # on a GPU: the native column
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import pytest
import torch

import harness
from harness.emulation import emulation_active
from harness.emulation.tracking import RaceError, RaceKind
from fixtures.emulated_device import skip_unless_the_emulated_device_can_be_entered

# These cases make races on purpose; report mode's RaceWarning for each is expected.
pytestmark = pytest.mark.filterwarnings("ignore::harness.emulation.tracking.RaceWarning")

N = 1 << 20  # 4 MiB of float32: a copy long enough to race on a GPU
CYCLES = 200_000_000  # about 0.1 s of torch.cuda._sleep on an H200

# The first parameter names the backend, as in the rest of suites/graphs (the fidelity table reads
# it): the emulated device in issue order, or the GPU. The adversarial schedule has tests of its own.
WHERE = [
    pytest.param("issue_order", id="emulated"),
    pytest.param("native", id="cuda", marks=pytest.mark.gpu),
]


@contextlib.contextmanager
def on_device(where: str, races: str = "report") -> Iterator[list | None]:
    """The device a case runs on; yields the tracker's reports (None natively)."""
    with tracked_device(where, races) as tracking:
        yield None if tracking is None else tracking.reports


@contextlib.contextmanager
def tracked_device(where: str, races: str = "report") -> Iterator:
    """The device a case runs on; yields its stream tracking (None natively)."""
    if where == "native":
        if emulation_active():
            pytest.skip("the native column needs the real GPU, not an emulation")
        yield None
        return
    skip_unless_the_emulated_device_can_be_entered()
    with harness.emulate_cuda(device="cpu", schedule=where, races=races) as state:
        yield state.streams_tracking


def main() -> torch.cuda.Stream:
    return torch.cuda.current_stream()


# --- the cases: each returns what the host saw ----------------------------------------------


def staging_reused(wait: bool) -> float:
    staging = torch.zeros(N, pin_memory=True)
    on_gpu = torch.zeros(N, device="cuda")
    staging.fill_(1.0)
    torch.cuda._sleep(CYCLES)
    on_gpu.copy_(staging, non_blocking=True)
    if wait:
        main().synchronize()
    staging.fill_(2.0)  # the next step's inputs
    torch.cuda.synchronize()
    return on_gpu[0].item()


def staging_rewritten_through_numpy(wait: bool) -> float:
    staging = torch.zeros(N, pin_memory=True)
    host = staging.numpy()  # writes through it reach no dispatcher (as a runtime's staging arrays)
    on_gpu = torch.zeros(N, device="cuda")
    host[:] = 1.0
    torch.cuda._sleep(CYCLES)
    on_gpu.copy_(staging, non_blocking=True)
    if wait:
        main().synchronize()
    host[:] = 2.0  # the next step's inputs
    torch.cuda.synchronize()
    return on_gpu[0].item()


def result_read_early(wait: bool) -> float:
    x = torch.full((N,), 3.0, device="cuda")
    host = torch.zeros(N, pin_memory=True)
    torch.cuda._sleep(CYCLES)
    y = x * 2
    host.copy_(y, non_blocking=True)
    if wait:
        main().synchronize()
    seen = host.tolist()[0]
    torch.cuda.synchronize()
    return seen


def side_stream_without_wait(wait: bool) -> float:
    side = torch.cuda.Stream()
    x = torch.ones(N, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(CYCLES)
    x.mul_(5)  # on the main stream, stalled behind the sleep
    if wait:
        side.wait_stream(main())
    with torch.cuda.stream(side):
        y = x + 1
    main().wait_stream(side)
    torch.cuda.synchronize()
    return y[0].item()


def side_stream_writes_under_a_queued_read(wait: bool) -> float:
    side = torch.cuda.Stream()
    x = torch.ones(N, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(CYCLES)
    y = x * 2  # on the main stream, stalled behind the sleep: still to read x
    done = torch.cuda.Event()
    done.record()
    if wait:
        side.wait_stream(main())
    with torch.cuda.stream(side):
        x.fill_(5.0)  # the next step's input, written on a side stream
    done.synchronize()  # the host waits for y alone
    seen = y[0].item()
    torch.cuda.synchronize()
    return seen


def freed_without_record_stream(record: bool) -> float:
    side = torch.cuda.Stream()
    x = torch.full((N,), 1.0, device="cuda")  # allocated on the main stream
    side.wait_stream(main())
    with torch.cuda.stream(side):
        torch.cuda._sleep(CYCLES)
        total = x.sum()
        if record:
            x.record_stream(side)
    del x  # the main stream may hand its block to the next allocation at once
    reused = torch.full((N,), 7.0, device="cuda")
    main().wait_stream(side)
    torch.cuda.synchronize()
    del reused
    return total.item() / N


def _graph_of(step: Callable[[], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    warmup = torch.cuda.Stream()
    warmup.wait_stream(main())
    with torch.cuda.stream(warmup):
        step()
    main().wait_stream(warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


def replay_inputs_rewritten(wait: bool) -> float:
    staging = torch.zeros(N, pin_memory=True)
    static = torch.zeros(N, device="cuda")

    def step() -> torch.Tensor:
        static.copy_(staging, non_blocking=True)  # the graph re-reads the pinned buffer each replay
        return static * 2

    graph, out = _graph_of(step)
    staging.fill_(1.0)
    torch.cuda.synchronize()
    torch.cuda._sleep(CYCLES)
    graph.replay()
    if wait:
        main().synchronize()
    staging.fill_(2.0)  # the next step's inputs, while the replay is in flight
    torch.cuda.synchronize()
    return out[0].item()


def graph_output_read_early(wait: bool) -> float:
    static = torch.zeros(N, device="cuda")
    graph, out = _graph_of(lambda: static * 2)
    host = torch.zeros(N, pin_memory=True)
    static.fill_(1.0)
    torch.cuda.synchronize()
    torch.cuda._sleep(CYCLES)
    graph.replay()
    host.copy_(out, non_blocking=True)
    if wait:
        main().synchronize()
    seen = host.tolist()[0]
    torch.cuda.synchronize()
    return seen


# case, value when racy, value when synchronized, the race kind, the two lines the report names
CASES = {
    "staging_reused": (staging_reused, 2.0, 1.0, RaceKind.HOST_WRITE_PENDING,
                       ("on_gpu.copy_(staging, non_blocking=True)", "staging.fill_(2.0)")),
    "staging_rewritten_through_numpy": (staging_rewritten_through_numpy, 2.0, 1.0,
                                        RaceKind.HOST_WRITE_PENDING,
                                        ("on_gpu.copy_(staging, non_blocking=True)", "numpy view")),
    "result_read_early": (result_read_early, 0.0, 6.0, RaceKind.HOST_READ_PENDING,
                          ("host.copy_(y, non_blocking=True)", "seen = host.tolist()[0]")),
    "side_stream_without_wait": (side_stream_without_wait, 2.0, 6.0, RaceKind.UNSYNCHRONIZED_STREAMS,
                                 ("x.mul_(5)", "y = x + 1")),
    "side_stream_writes_under_a_queued_read": (side_stream_writes_under_a_queued_read, 10.0, 2.0,
                                               RaceKind.UNSYNCHRONIZED_STREAMS,
                                               ("y = x * 2", "x.fill_(5.0)")),
    "freed_without_record_stream": (freed_without_record_stream, 7.0, 1.0, RaceKind.FREED_IN_USE,
                                    ("total = x.sum()", "del x",
                                     "reused = torch.full((N,), 7.0, device=\"cuda\")")),
    "replay_inputs_rewritten": (replay_inputs_rewritten, 4.0, 2.0, RaceKind.HOST_WRITE_PENDING,
                                ("graph.replay()", "staging.fill_(2.0)")),
    "graph_output_read_early": (graph_output_read_early, 0.0, 2.0, RaceKind.HOST_READ_PENDING,
                                ("host.copy_(out, non_blocking=True)", "seen = host.tolist()[0]")),
}
# The emulator keeps memory that queued work uses alive (its ops hold their tensors), so a block
# freed without record_stream is never handed out under a stalled stream: the tracker names the
# race, the values stay right.
RIGHT_VALUES_ON_THE_EMULATOR = {"freed_without_record_stream"}


def _racy_run(case: str, where: str) -> None:
    run, racy, right, kind, lines = CASES[case]
    with on_device(where) as reports:
        run(True)  # warm up: a kernel's first launch loads its module and syncs the device
        if reports is not None:
            assert reports == []
        seen = run(False)
    if reports is None or case not in RIGHT_VALUES_ON_THE_EMULATOR:
        assert seen == racy
    if reports is not None:
        assert [r.kind for r in reports] == [kind]
        text = str(reports[0])
        assert "test_stream_races.py" in text and all(line in text for line in lines)
        assert f"shape ({N},), torch.float32" in text


def _synchronized_run(case: str, where: str) -> None:
    run, racy, right, kind, lines = CASES[case]
    with on_device(where) as reports:
        run(True)
        assert run(True) == right
    assert not reports


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("where", WHERE)
def test_racy_version_shows_the_race(where, case):
    _racy_run(case, where)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("where", WHERE)
def test_synchronized_version_is_right_and_quiet(where, case):
    _synchronized_run(case, where)


@pytest.mark.parametrize("case", list(CASES))
def test_adversarial_schedule_shows_the_race(case):
    _racy_run(case, "adversarial")


@pytest.mark.parametrize("case", list(CASES))
def test_adversarial_schedule_keeps_the_synchronized_version_right(case):
    _synchronized_run(case, "adversarial")


@pytest.mark.parametrize("case", list(CASES))
def test_strict_tracking_raises_at_the_race(case):
    run, racy, right, kind, lines = CASES[case]
    with pytest.raises(RaceError) as caught:
        with on_device("issue_order", races="strict"):
            run(False)
    assert caught.value.report.kind is kind


def test_a_report_names_the_tensor_by_its_path_from_an_object_given():
    class Loop:
        def __init__(self) -> None:
            self.staging = torch.zeros(8, pin_memory=True)
            self.inputs = torch.zeros(8, device="cuda")

    with tracked_device("issue_order") as tracking:
        loop = Loop()
        tracking.name_tensors(loop, "loop")
        loop.inputs.copy_(loop.staging, non_blocking=True)
        loop.staging.fill_(1.0)
    assert "race on tensor loop.staging (shape (8,), torch.float32)" in str(tracking.reports[0])


def _two_graphs_replayed_at_once(share_pool: bool) -> tuple[float, float]:
    """Two graphs with temporaries, replayed on two streams released together by one stall:
    their kernels run concurrently. Returns their outputs' sums."""
    def chain(t: torch.Tensor, add: float) -> torch.Tensor:
        for _ in range(4):
            t = (t.clone() + add) + (t.clone() + add)
        return t

    start = torch.ones(64, device="cuda")
    first, second = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    capturing = torch.cuda.Stream()
    capturing.wait_stream(main())
    with torch.cuda.stream(capturing):
        first.capture_begin()
        out_first = chain(start, 1.0)
        first.capture_end()
        second.capture_begin(*((first.pool(),) if share_pool else ()))
        out_second = chain(start, 2.0)
        second.capture_end()
    torch.cuda.synchronize()
    left, right = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(left):
        torch.cuda._sleep(CYCLES)
        right.wait_stream(left)  # both replays start when the stall ends
        first.replay()
    with torch.cuda.stream(right):
        second.replay()
    main().wait_stream(left)
    main().wait_stream(right)
    return out_first.sum().item() / 64, out_second.sum().item() / 64


def test_two_graphs_sharing_a_pool_corrupt_each_other_when_replayed_concurrently():
    # Per element: x -> 2 (x + add), four times from 1: 46 with add 1, 76 with add 2.
    with on_device("issue_order") as reports:
        assert _two_graphs_replayed_at_once(share_pool=False) == (46.0, 76.0)
        assert reports == []
        shared = _two_graphs_replayed_at_once(share_pool=True)
    assert shared[0] != 46.0 and shared[1] != 76.0  # interleaved kernels clobber shared temporaries
    assert reports and all("replay of CUDAGraph" in str(r) for r in reports)
    with pytest.raises(RaceError, match="replay of CUDAGraph .* replay of CUDAGraph"):
        with on_device("issue_order", races="strict"):
            _two_graphs_replayed_at_once(share_pool=True)


def test_report_mode_warns_of_each_race_where_it_happens():
    from harness.emulation.tracking import RaceWarning

    with pytest.warns(RaceWarning, match="host write while device work on the memory is pending"):
        with on_device("issue_order") as reports:
            staging_reused(False)
    assert len(reports) == 1
