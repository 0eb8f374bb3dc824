"""Another thread's device allocation while a capture is under way. Where no segment has room,
PyTorch's caching allocator calls cudaMalloc, and takes the relaxed capture-mode guard around it
only when the calling thread's current stream is capturing (`cudaMallocMaybeCapturing`): another
thread's allocation on its own stream during a "global" capture is a potentially unsafe call,
refused with "operation not permitted when stream is capturing", and the capture's end then fails
(`torch.cuda.graph`'s documentation of capture_error_mode: "global" errors on actions in other
threads). The emulated device let it through. An allocation a live segment has room for calls
nothing, and a "thread_local" capture is no concern of another thread's; the capturing thread's
own allocation comes from the graph's pool. The rows run natively too."""

from __future__ import annotations

import threading

import pytest
import torch

LARGE = (64 << 20) + 512  # no live segment has room: a new one (cudaMalloc)
SMALL = 4096  # the small pool's live 2 MiB segment has room


def _capture_with(allocate, mode: str) -> torch.Tensor:
    x = torch.ones(8, device="cuda")  # keeps a small-pool segment alive on this stream
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    caller_stream = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph, capture_error_mode=mode):  # empties the allocator's cache first
            x.add_(1)
            allocate()
    finally:
        torch.cuda.set_stream(caller_stream)  # a failed capture leaves its stream current
    graph.replay()
    torch.cuda.synchronize()
    return x


def _in_another_thread(outcome: dict, nbytes: int):
    def allocate_there():
        try:
            torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            outcome["thread"] = "ok"
        except Exception as error:  # noqa: BLE001 (the row compares what the thread got)
            outcome["thread"] = error

    def allocate():
        worker = threading.Thread(target=allocate_there)
        worker.start()
        worker.join()

    return allocate


def test_another_threads_new_segment_is_refused_in_a_global_capture(cuda_kind):
    outcome: dict = {}
    with pytest.raises(RuntimeError, match="operation failed due to a previous error during capture"):
        _capture_with(_in_another_thread(outcome, LARGE), "global")
    refused = outcome["thread"]
    assert isinstance(refused, torch.AcceleratorError), refused
    assert str(refused).startswith("CUDA error: operation not permitted when stream is capturing")


def test_another_threads_allocation_in_a_live_segment_is_no_concern_of_a_global_capture(cuda_kind):
    outcome: dict = {}
    x = _capture_with(_in_another_thread(outcome, SMALL), "global")
    assert outcome["thread"] == "ok" and x.tolist() == [2.0] * 8


def test_another_threads_new_segment_is_no_concern_of_a_thread_local_capture(cuda_kind):
    outcome: dict = {}
    x = _capture_with(_in_another_thread(outcome, LARGE), "thread_local")
    assert outcome["thread"] == "ok" and x.tolist() == [2.0] * 8


def test_the_capturing_threads_own_new_segment_comes_from_the_graphs_pool(cuda_kind):
    x = _capture_with(lambda: torch.empty(LARGE, dtype=torch.uint8, device="cuda"), "global")
    assert x.tolist() == [2.0] * 8
