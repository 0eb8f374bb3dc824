"""A runtime captures its decode step while a background thread (a prefetcher staging the next
batch) allocates a device buffer. The capture uses torch's default capture_error_mode, "global":
the background thread's allocation needs a new segment, PyTorch's allocator calls cudaMalloc
without the relaxed guard it takes for a capturing stream's allocation, and CUDA refuses it with
"operation not permitted when stream is capturing" and invalidates the capture (PyTorch PR #107407
exposed capture_error_mode for this, and moved inductor's captures to "thread_local"). The emulated
device let the allocation through and the capture succeed. Fixed: capture with
`capture_error_mode="thread_local"`, which leaves other threads' calls alone."""

from __future__ import annotations

import threading

import pytest
import torch

from harness.emulation import emulation_active

STAGING_BYTES = (48 << 20) + 512  # the next batch's staging buffer: no live segment has room


class Runner:
    def __init__(self):
        self.hidden = torch.randn(4, 64, device="cuda")
        self.weight = torch.randn(64, 64, device="cuda")
        self.staged: list = []

    def step(self) -> torch.Tensor:
        return torch.tanh(self.hidden @ self.weight)

    def stage_next_batch(self) -> None:
        try:
            self.staged.append(torch.empty(STAGING_BYTES, dtype=torch.uint8, device="cuda"))
        except Exception as error:  # noqa: BLE001 (what the prefetcher met is the outcome)
            self.staged.append(error)

    def capture(self, mode: str) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode=mode):
            out = self.step()
            prefetcher = threading.Thread(target=self.stage_next_batch)
            prefetcher.start()
            prefetcher.join()
        return graph, out


def test_buggy_a_global_capture_refuses_the_prefetchers_allocation():
    if emulation_active() == "cuda":
        pytest.skip("the graph sanitizer begins no real capture on the GPU, so CUDA's allocator "
                    "finds none to refuse another thread's new segment (docs/fidelity.md)")
    runner = Runner()
    caller_stream = torch.cuda.current_stream()
    try:
        with pytest.raises(RuntimeError,
                           match="operation failed due to a previous error during capture"):
            runner.capture("global")
    finally:  # torch.cuda.graph leaves its capture stream current when capture_end raises
        torch.cuda.set_stream(caller_stream)
    refused = runner.staged[0]
    assert isinstance(refused, torch.AcceleratorError)
    assert str(refused).startswith("CUDA error: operation not permitted when stream is capturing")


def test_fixed_a_thread_local_capture_leaves_the_prefetcher_alone():
    runner = Runner()
    graph, out = runner.capture("thread_local")
    runner.hidden.copy_(torch.randn(4, 64, device="cuda"))
    graph.replay()
    assert isinstance(runner.staged[0], torch.Tensor)
    assert torch.allclose(out, runner.step())
