"""Work on the legacy default stream while another stream captures, from the capturing thread or
from another thread, in each capture_error_mode. torch's pooled streams (a capture's stream among
them) are created cudaStreamNonBlocking, and the legacy stream waits only on blocking streams, so
a launch there makes no dependency on the capture; nor is a launch one of the potentially unsafe
calls a capture mode prohibits. CUDA runs it at once and the capture ends valid: measured on an
H100 (torch 2.11, 2026-12-06) in all six cases. The emulated device refused the capturing
thread's launch in "global" and "thread_local" mode, and invalidated the capture, until then.
The rows run natively on a GPU and in the graph sanitizer too (whose capturing thread's work on
another stream runs at once since 2026-12-06, sanitizer_threads.py; not yet run on a GPU)."""

from __future__ import annotations

import threading

import pytest
import torch

MODES = ("global", "thread_local", "relaxed")


def _legacy_launch_during_a_capture(mode: str, in_thread: bool) -> tuple[str, list[float], list[float]]:
    """(what the launch did, `log` after the capture, after two replays): the capture adds 1
    to `log` before and after the launch of `log.add_(7)` on the legacy default stream."""
    log = torch.zeros(4, device="cuda")
    capturing = torch.cuda.Stream()
    torch.cuda.synchronize()  # the zeros, on the current stream, before the other streams' work
    for stream in (capturing, torch.cuda.default_stream()):  # kernels loaded before the capture
        with torch.cuda.stream(stream):
            log.add_(0)
        torch.cuda.synchronize()
    outcome: list[str] = []

    def launch() -> None:
        try:
            with torch.cuda.stream(torch.cuda.default_stream()):
                log.add_(7)
            outcome.append("ran")
        except RuntimeError as error:
            outcome.append(str(error))

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capturing, capture_error_mode=mode):
        log.add_(1)
        if in_thread:
            worker = threading.Thread(target=launch)
            worker.start()
            worker.join()
        else:
            launch()
        log.add_(1)
    torch.cuda.synchronize()
    after_capture = log.tolist()
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    return outcome[0], after_capture, log.tolist()


@pytest.mark.parametrize("in_thread", [True, False], ids=["another thread", "capturing thread"])
@pytest.mark.parametrize("mode", MODES)
def test_a_legacy_stream_launch_runs_at_once_outside_the_graph(cuda_kind, mode, in_thread):
    assert _legacy_launch_during_a_capture(mode, in_thread) == ("ran", [7.0] * 4, [11.0] * 4)
