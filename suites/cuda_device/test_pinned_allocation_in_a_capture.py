"""A pinned host allocation while a capture is under way. A new pinned block is a cudaHostAlloc,
a potentially unsafe call: PyTorch's host allocator makes it under a relaxed capture-mode guard, so
the capturing thread's own is captured around, but another thread's during a "global" capture is
refused with "operation not permitted when stream is capturing" and invalidates the capture, whose
end then fails (measured on an H200, torch 2.11). The emulated device let it through. In
"thread_local" mode another thread's is no concern of the capture. The rows run natively too."""

from __future__ import annotations

import threading

import pytest
import torch

NBYTES = (3 << 20) + 1  # a size no earlier test left a cached block of (rounded up to 4 MiB)


def _capture_with(allocate, mode: str) -> torch.Tensor:
    x = torch.ones(8, device="cuda")
    torch.cuda.synchronize()
    torch._C._host_emptyCache()  # the allocation below must be a new block
    graph = torch.cuda.CUDAGraph()
    caller_stream = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph, capture_error_mode=mode):
            x.add_(1)
            allocate()
    finally:
        torch.cuda.set_stream(caller_stream)  # a failed capture leaves its stream current
    graph.replay()
    torch.cuda.synchronize()
    return x


def _in_another_thread(outcome: dict):
    def pin():
        try:
            torch.empty(NBYTES, dtype=torch.uint8, pin_memory=True)
            outcome["thread"] = "ok"
        except Exception as error:  # noqa: BLE001 (the row compares what the thread got)
            outcome["thread"] = error

    def allocate():
        worker = threading.Thread(target=pin)
        worker.start()
        worker.join()

    return allocate


def test_the_capturing_threads_own_pinned_allocation_is_captured_around(cuda_kind):
    x = _capture_with(lambda: torch.empty(NBYTES, dtype=torch.uint8, pin_memory=True), "global")
    assert x.tolist() == [2.0] * 8


def test_another_threads_pinned_allocation_is_refused_in_a_global_capture(cuda_kind):
    outcome: dict = {}
    with pytest.raises(RuntimeError, match="operation failed due to a previous error during capture"):
        _capture_with(_in_another_thread(outcome), "global")
    refused = outcome["thread"]
    assert isinstance(refused, torch.AcceleratorError)
    assert str(refused).startswith("CUDA error: operation not permitted when stream is capturing")


def test_another_threads_pinned_allocation_is_no_concern_of_a_thread_local_capture(cuda_kind):
    outcome: dict = {}
    x = _capture_with(_in_another_thread(outcome), "thread_local")
    assert outcome["thread"] == "ok" and x.tolist() == [2.0] * 8
