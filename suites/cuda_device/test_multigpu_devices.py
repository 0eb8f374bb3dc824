"""Two devices, as CUDA keeps them apart: the current device is per host thread (a new thread starts
on device 0), and the allocator's statistics are per device. The emulated rows use
`emulate_cuda(device_count=2)`; the native rows need two GPUs and show CUDA's own verdict (the
`two_devices` fixture, conftest.py)."""

from __future__ import annotations

import queue
import sys
import threading

import pytest
import torch


def _in_a_thread(work):
    out: list = []
    worker = threading.Thread(target=lambda: out.append(work()))
    worker.start()
    worker.join()
    return out[0]


def test_a_new_thread_starts_on_device_zero_whatever_its_starter_set(two_devices):
    torch.cuda.set_device(1)
    try:
        seen = _in_a_thread(lambda: (torch.cuda.current_device(),
                                     str(torch.ones(1, device="cuda").device)))
        assert seen == (0, "cuda:0")
        assert torch.cuda.current_device() == 1
    finally:
        torch.cuda.set_device(0)


def test_a_threads_device_context_leaves_the_other_threads_device_alone(two_devices):
    entered, release = threading.Event(), threading.Event()

    def on_device_one() -> int:
        with torch.cuda.device(1):
            entered.set()
            release.wait()
            return torch.cuda.current_device()

    worker = threading.Thread(target=lambda: seen.append(on_device_one()))
    seen: list[int] = []
    worker.start()
    entered.wait()
    try:
        # the worker is inside device 1; this thread's device stays 0, and its own context nests
        assert torch.cuda.current_device() == 0
        with torch.cuda.device(0):
            assert str(torch.ones(1, device="cuda").device) == "cuda:0"
    finally:
        release.set()
        worker.join()
    assert seen == [1] and torch.cuda.current_device() == 0


def test_each_device_keeps_its_own_memory_statistics(two_devices):
    torch.cuda.synchronize()
    before = [torch.cuda.memory_allocated(i) for i in (0, 1)]
    reserved_before = torch.cuda.memory_reserved(1)
    on_zero = torch.ones(1024, device="cuda:0")
    assert torch.cuda.memory_allocated(0) == before[0] + 4096
    assert torch.cuda.memory_allocated(1) == before[1]
    on_one = torch.ones(3 << 20, device="cuda:1")
    moved = on_zero.to("cuda:1")
    with torch.cuda.device(1):
        made_inside = torch.empty(256, device="cuda")
    assert torch.cuda.memory_allocated(1) == before[1] + (12 << 20) + 4096 + 1024
    assert torch.cuda.memory_allocated(0) == before[0] + 4096
    assert torch.cuda.memory_stats(1)["allocation.all.current"] >= 3
    assert torch.cuda.memory_reserved(1) > reserved_before
    del on_one, moved, made_inside
    assert torch.cuda.memory_allocated(1) == before[1]
    assert torch.cuda.memory_allocated(0) == before[0] + 4096
    torch.cuda.reset_peak_memory_stats(0)
    assert torch.cuda.max_memory_allocated(0) == torch.cuda.memory_allocated(0)
    assert torch.cuda.max_memory_allocated(1) >= before[1] + (12 << 20)


def test_copies_to_device_zero_count_there_whatever_device_is_current(two_devices):
    # a copy's memory is the target device's allocation, device 0 included, while the caller's
    # current device is another (the copy's device guard makes the target current)
    torch.cuda.synchronize()
    with torch.cuda.device(1):
        before = [torch.cuda.memory_allocated(i) for i in (0, 1)]
        on_zero = torch.ones(1024, device="cuda:0")
        made = (torch.ones(1024).to("cuda:0"), torch.ones(1024).cuda(0), on_zero.to(torch.float64))
        assert [str(t.device) for t in made] == ["cuda:0"] * 3
        assert torch.cuda.memory_allocated(0) == before[0] + 5 * 4096  # float64: two of them
        assert torch.cuda.memory_allocated(1) == before[1]


def test_elapsed_time_between_events_of_two_devices_raises(two_devices):
    events = []
    for index in (0, 1, 0):
        with torch.cuda.device(index):
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            event.synchronize()
            events.append(event)
    first, on_one, later = events
    for current in (0, 1):
        with torch.cuda.device(current):
            with pytest.raises(RuntimeError):
                first.elapsed_time(on_one)
            assert first.elapsed_time(later) >= 0  # one device's events, whatever is current


@pytest.mark.parametrize("tracked", [False, True], ids=["untracked", "stream_tracking"])
def test_a_new_tensor_from_to_on_its_own_device_stays_there(two_devices, tracked):
    if tracked:
        if two_devices == "native":
            pytest.skip("stream tracking is the emulated device's")
        torch.cuda._sleep(1)  # starts the emulated device's stream tracking
    x = torch.full((4,), 4.0, device="cuda:1")
    before = torch.cuda.memory_allocated(1)
    made = (x.to(device=torch.device("cuda:1"), non_blocking=True, copy=True),
            x.to(torch.float16), x.to("cuda:1", torch.float64), x.to(x, copy=True))
    assert [str(t.device) for t in made] == ["cuda:1"] * 4
    assert all(t.data_ptr() != x.data_ptr() for t in made)
    assert torch.cuda.memory_allocated(1) == before + 4 * 512


def test_grad_scaler_scales_outputs_on_two_devices(two_devices):
    scaler = torch.amp.GradScaler(device="cuda", init_scale=2.0)
    t0 = torch.full((1,), 4.0, device="cuda:0")
    t1 = torch.full((1,), 4.0, device="cuda:1")
    scaled = scaler.scale((t1.clone(), [t0.clone(), t1.clone()]))
    assert [str(t.device) for t in (scaled[0], *scaled[1])] == ["cuda:1", "cuda:0", "cuda:1"]
    assert [t.item() for t in (scaled[0], *scaled[1])] == [8.0, 8.0, 8.0]


@pytest.mark.parametrize("tracked", [False, True], ids=["untracked", "stream_tracking"])
def test_gradients_land_on_their_parameters_devices_across_a_copy(two_devices, tracked):
    if tracked:
        if two_devices == "native":
            pytest.skip("stream tracking is the emulated device's")
        torch.cuda._sleep(1)  # starts the emulated device's stream tracking
    torch.manual_seed(0)
    first, second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)
    x = torch.randn(3, 4)
    first(x).relu().matmul(second.weight.t()).add(second.bias).square().sum().backward()
    expected = [p.grad.clone() for p in (*first.parameters(), *second.parameters())]
    first.cuda(0).zero_grad(), second.cuda(1).zero_grad()
    optimizer = torch.optim.SGD([*first.parameters(), *second.parameters()], lr=0.1, foreach=True)
    scaler = torch.amp.GradScaler("cuda", init_scale=4.0)
    loss = second(first(x.cuda(0)).relu().to("cuda:1")).square().sum()
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    params = [*first.parameters(), *second.parameters()]
    assert [str(p.grad.device) for p in params] == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    for p, want in zip(params, expected):
        torch.testing.assert_close(p.grad.cpu(), want)
    scaler.step(optimizer)
    scaler.update()
    assert [str(p.device) for p in params] == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]


def test_copies_between_devices_are_ordered_with_both_current_streams(two_devices):
    # PyTorch's test_copy_streams: a copy between devices waits for, and is waited for by, the
    # current streams of both devices, so the second copy lands after the first, stalled one
    x = torch.zeros(5, 5, device="cuda:0")
    y = torch.zeros(5, 5, device="cuda:1")
    x_plus_one = x + 1
    s0, s2 = torch.cuda.Stream(device=0), torch.cuda.Stream(device=0)
    s1 = torch.cuda.Stream(device=1)
    with torch.cuda.stream(s0):
        torch.cuda._sleep(50_000_000)
        with torch.cuda.stream(s1):
            y.copy_(x_plus_one)
    with torch.cuda.stream(s2), torch.cuda.stream(s1):
        y.copy_(x)
    s1.synchronize()
    assert y.cpu().eq(0).all()


def _timed_sleep(cycles: int) -> tuple[torch.cuda.Event, torch.cuda.Event]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    return start, end


def test_sleeps_on_two_devices_overlap_in_event_time(two_devices):
    # PyTorch's test_stream_event_nogil compares so (its threads aside): each device spins for
    # about 200 ms at once, so the span is about one sleep, not the sum of the two. The sleeps are
    # long so that the host's own time between the records (a loaded machine's stalls) stays far
    # below the 120 ms the comparison leaves it; on the emulated device they cost no wall time.
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    span_start, span_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    span_start.record()
    with torch.cuda.device(1):
        on_one = _timed_sleep(400_000_000)
    on_zero = _timed_sleep(400_000_000)
    torch.cuda.synchronize(1)
    span_end.record()
    span_end.synchronize()
    each = [start.elapsed_time(end) for start, end in (on_zero, on_one)]
    assert min(each) >= 160.0  # 400M cycles at a 2 GHz clock or slower: 200 ms or more
    assert sum(each) > 1.3 * span_start.elapsed_time(span_end)


def _waited_sleep(cycles: int) -> float:
    """A sleep on the current stream between two events, waited for: its time (PyTorch's
    `_stream_synchronize` helper of test_stream_event_nogil)."""
    start, end = _timed_sleep(cycles)
    torch.cuda.current_stream().synchronize()
    return start.elapsed_time(end)


def test_two_threads_waiting_on_two_devices_overlap_in_event_time(two_devices):
    # PyTorch's test_stream_event_nogil: on a GPU each thread blocks in its synchronize with the
    # GIL released, so the other thread's sleep runs meanwhile on its own device. The emulated
    # synchronize returns at once and the other thread runs later; with one host clock for all
    # threads its sleep began after the first one's wait (the span was the sum of the two).
    ready, go, result = queue.Queue(), queue.Queue(), queue.Queue()
    cycles = 400_000_000  # about 200 ms: the host's own stalls stay far below the margin

    def on_device_one() -> None:
        with torch.cuda.device(1):
            ready.put(0)
            go.get()
            result.put(_waited_sleep(cycles))

    child = threading.Thread(target=on_device_one, daemon=True)
    child.start()
    ready.get()
    span_start = torch.cuda.Event(enable_timing=True)
    span_end = torch.cuda.Event(enable_timing=True)
    # Python hands the GIL to the waiting child only where this thread blocks: in CUDA's
    # synchronize (which releases it), or here at `result.get()`, so that on the emulated device
    # the child's sleep is always issued after this thread's wait returned
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        span_start.record()
        go.put(0)
        parent_time = _waited_sleep(cycles)
        child_time = result.get()
    finally:
        sys.setswitchinterval(interval)
    span_end.record()
    span_end.synchronize()
    child.join()
    assert min(parent_time, child_time) >= 160.0
    assert parent_time + child_time > 1.3 * span_start.elapsed_time(span_end)


def test_a_graph_replays_on_its_capture_devices_stream(two_devices):
    """CUDAGraph::replay launches on the current stream of the graph's capture device (a device
    guard on it), whatever device the caller has current: a graph of cuda:1 replayed with cuda:0
    current is ordered after cuda:1's work, here the copy into its input. The emulated device
    replayed it on cuda:0's stream (a race with the copy) before 2026-12-07."""
    with torch.cuda.device(1):
        static = torch.zeros(4, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = static * 2
    assert torch.cuda.current_device() == 0
    static.copy_(torch.ones(4, device="cuda:1"))  # on cuda:1's current stream
    graph.replay()
    torch.testing.assert_close(out, torch.full((4,), 2.0, device="cuda:1"))


@pytest.mark.parametrize("kind", ["cuda", "generic"])
def test_an_event_recorded_again_on_another_devices_stream_raises(two_devices, kind):
    """CUDA makes an event on its first record's device; a later record on another device's
    stream is refused (c10's CUDAEvent::record for torch.cuda.Event, CUDAGuardImpl::record for
    torch.Event). Waiting on it from another device's stream is allowed."""
    event = torch.cuda.Event() if kind == "cuda" else torch.Event()
    event.record(torch.cuda.current_stream(1))
    torch.cuda.current_stream(0).wait_event(event)
    event.record(torch.cuda.current_stream(1))  # its own device again
    words = ("Event device 1 does not match recording stream's device 0." if kind == "cuda"
             else "Event device index 1 does not match recording stream's device index 0.")
    with pytest.raises(RuntimeError, match=words):
        event.record(torch.cuda.current_stream(0))
    with torch.cuda.device(1):
        event.record()
    torch.cuda.synchronize()
