"""Work a second thread issues during a capture. CUDA's capture belongs to the stream: whichever
thread launches into a stream taking part in the capture (the capturing stream, or a side stream
forked into it), the kernel is captured, not run, and replays with the graph (capture_error_mode
governs only the unsafe calls of other threads, not launches). Its launches on any other stream
run at once and stay out of the graph. The emulated device ran every launch of another thread at
once until 2026-12-06: torch's dispatch modes are per thread, and the capture's recorder never saw
the worker's op (emulation/capture_threads.py routes it now; docs/fidelity.md, "Generator calls,
launch order and capture branches"). The rows run natively on a GPU too, where they show CUDA's
answer."""

from __future__ import annotations

import re
import threading
from typing import Callable

import pytest
import torch

import harness
from harness.graphs import CaptureError
from harness.emulation.tracking import RaceWarning
from fixtures.emulated_device import skip_unless_the_emulated_device_can_be_entered
from suites.cuda_device._own_process import in_a_process_of_its_own

MODES = ("thread_local", "global", "relaxed")


def _skip_the_sanitizer(cuda_kind: str, why: str) -> None:
    if cuda_kind == "sanitizer":
        pytest.skip(f"the graph sanitizer: {why}")


def _warm_up(log: torch.Tensor, *streams: torch.cuda.Stream) -> None:
    """The kernels loaded before the capture, so nothing lazy happens inside it; each stream
    ordered after the work before it."""
    for stream in streams:
        torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            log.add_(0)
    torch.cuda.synchronize()


def _capture_while_a_worker_works(work: Callable[[torch.Tensor, torch.cuda.Stream], None],
                                  mode: str, *, fork: bool = False
                                  ) -> tuple[list[float], list[float]]:
    """`work(log, stream)` runs in a worker thread while the main thread captures on its own
    stream; `stream` is the capturing stream, or (`fork`) a side stream forked into the capture
    before the worker starts and joined back after it ends. Returns `log` after the capture, and
    after two replays."""
    log = torch.zeros(4, device="cuda")
    capturing, side = torch.cuda.Stream(), torch.cuda.Stream()
    _warm_up(log, capturing, side)
    graph = torch.cuda.CUDAGraph()
    go, done = threading.Event(), threading.Event()
    target = side if fork else capturing

    def worker() -> None:
        go.wait()
        work(log, target)
        done.set()

    thread = threading.Thread(target=worker)
    thread.start()
    torch.cuda.synchronize()
    try:
        with torch.cuda.graph(graph, stream=capturing, capture_error_mode=mode):
            if fork:
                side.wait_stream(capturing)
            go.set()
            done.wait()
            if fork:
                capturing.wait_stream(side)
    finally:
        go.set()
        thread.join()
    torch.cuda.synchronize()
    after_capture = log.tolist()
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    return after_capture, log.tolist()


def _add_one(log: torch.Tensor, stream: torch.cuda.Stream) -> None:
    with torch.cuda.stream(stream):
        log.add_(1)


@pytest.mark.parametrize("mode", MODES)
def test_a_launch_from_another_thread_into_the_capturing_stream_is_captured(cuda_kind, mode):
    assert _capture_while_a_worker_works(_add_one, mode) == ([0.0] * 4, [2.0] * 4)


def test_a_launch_from_another_thread_into_a_forked_side_stream_is_captured(cuda_kind):
    assert _capture_while_a_worker_works(_add_one, "thread_local", fork=True) == (
        [0.0] * 4, [2.0] * 4)


def test_a_fresh_result_of_another_thread_is_captured_into_the_graph(cuda_kind):
    """A result made by the worker's op comes from the graph's pool and is filled by each
    replay; the worker's copy into `log` replays after it."""
    _skip_the_sanitizer(cuda_kind, "CUDA's allocator routes the capturing thread's allocations "
                        "to the graph's pool (a thread filter; a second filter for the same pool "
                        "is refused), so the worker's fresh result would not come from the pool")

    def doubled_plus_one(log: torch.Tensor, stream: torch.cuda.Stream) -> None:
        with torch.cuda.stream(stream):
            log.copy_(log * 2 + 1)

    assert _capture_while_a_worker_works(doubled_plus_one, "thread_local") == (
        [0.0] * 4, [3.0] * 4)


def test_another_threads_launch_on_a_stream_outside_the_capture_runs_at_once(cuda_kind):
    log = torch.zeros(4, device="cuda")
    outside = torch.cuda.Stream()

    def on_its_own_stream(_: torch.Tensor, __: torch.cuda.Stream) -> None:
        with torch.cuda.stream(outside):
            log.add_(5)
        outside.synchronize()  # allowed in thread_local mode: not a capturing stream

    after_capture, after_replays = _capture_while_a_worker_works(on_its_own_stream,
                                                                 "thread_local")
    assert after_capture == after_replays == [0.0] * 4  # the helper's log is its own
    assert log.tolist() == [5.0] * 4  # ran once, at capture, and never again


def _worker_left_a_fork_unjoined() -> tuple[str, list[float]]:
    """What ending a capture whose forked stream got the worker's launch, never joined back,
    raised; and the worker's tensor after it."""
    log = torch.zeros(4, device="cuda")
    capturing, side = torch.cuda.Stream(), torch.cuda.Stream()
    _warm_up(log, capturing, side)
    graph = torch.cuda.CUDAGraph()
    thread = threading.Thread(target=_add_one, args=(log, side))
    caller = torch.cuda.current_stream()
    raised = ""
    try:
        with torch.cuda.graph(graph, stream=capturing, capture_error_mode="thread_local"):
            side.wait_stream(capturing)
            thread.start()
            thread.join()
    except (CaptureError, RuntimeError) as error:
        raised = str(error)
    finally:
        torch.cuda.set_stream(caller)  # torch.cuda.graph leaves its stream current when its end raises
    torch.cuda.synchronize()
    return raised, log.tolist()


def test_a_forked_stream_the_worker_left_unjoined_fails_the_capture(cuda_kind):
    """The capture's stream rules see the worker's launch on the forked stream: a capture that
    never joins that stream back fails as on CUDA, and the launch never ran. A failed real capture
    leaves CUDA's process state broken: natively the capture runs in a process of its own."""
    _skip_the_sanitizer(cuda_kind, "its captures check no unjoined forks (CUDA's own check, "
                        "made by the emulated device's stream rules only)")
    if cuda_kind == "native":
        raised, log = in_a_process_of_its_own(__file__, "_worker_left_a_fork_unjoined")
    else:
        raised, log = _worker_left_a_fork_unjoined()
    assert re.search("cudaErrorStreamCaptureUnjoined|unjoined", raised), raised
    assert log == [0.0] * 4  # captured, never run


def test_without_stream_tracking_the_launch_is_captured_too():
    """With races="off" the device tracks no streams and the worker's only device mode is the
    placement mode: which work a capture records does not depend on the races setting."""
    skip_unless_the_emulated_device_can_be_entered()
    with harness.emulate_cuda(device="cpu", races="off"):
        assert _capture_while_a_worker_works(_add_one, "thread_local") == ([0.0] * 4, [2.0] * 4)


def test_the_race_checks_of_the_capture_see_another_threads_launch():
    """The worker's write on the capturing stream is a node of the graph, unordered with the
    forked branch's read of the same buffer: a race at every replay, found at capture."""
    skip_unless_the_emulated_device_can_be_entered()
    with harness.emulate_cuda(device="cpu", races="report"):
        buf, out = torch.zeros(4, device="cuda"), torch.zeros(4, device="cuda")
        capturing, side = torch.cuda.Stream(), torch.cuda.Stream()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        thread = threading.Thread(target=_add_one, args=(buf, capturing))
        with pytest.warns(RaceWarning, match=r"captured aten.add_.*log.add_\(1\).*captured aten.mul"):
            with torch.cuda.graph(graph, stream=capturing, capture_error_mode="thread_local"):
                side.wait_stream(capturing)
                with torch.cuda.stream(side):
                    out.copy_(buf * 2)
                thread.start()
                thread.join()
                capturing.wait_stream(side)
