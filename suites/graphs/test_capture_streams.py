"""Streams during a capture on the emulated CUDA device, as CUDA has them: work on the legacy
default stream running at once outside the graph (CUDA's answer in every mode, from every thread:
suites/cuda_device/test_legacy_stream_work_during_a_capture.py), fork and join through events,
and a fork never joined back failing the capture; with races strict and off alike."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch

import harness
from harness.graphs import CaptureError
from harness.emulation import emulation_active
from fixtures.emulated_device import skip_unless_the_emulated_device_can_be_entered


@pytest.fixture(params=["strict", "off"], ids=["races strict", "races off"])
def cuda(request) -> Iterator[None]:
    """Which work a capture records does not depend on the races setting: with races off the
    device tracks no streams, and until 2026-12-06 recorded every stream's work into the graph."""
    skip_unless_the_emulated_device_can_be_entered()
    with harness.emulate_cuda(device="cpu", races=request.param):
        yield


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_default_stream_work_runs_outside_the_graph(cuda, mode):
    x = torch.zeros(4, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode=mode):
        x.add_(1)  # captured
        with torch.cuda.stream(torch.cuda.default_stream()):
            x.add_(10)  # runs now, once
    torch.cuda.synchronize()
    assert x.tolist() == [10.0] * 4
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    assert x.tolist() == [12.0] * 4


def test_a_side_stream_forked_and_joined_by_events_is_captured(cuda):
    x = torch.ones(4, device="cuda")
    y = torch.zeros(4, device="cuda")
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forked = torch.cuda.Event()
        forked.record()
        side.wait_event(forked)  # fork: the side stream joins the capture
        with torch.cuda.stream(side):
            y.copy_(x * 3)
        joined = torch.cuda.Event()
        joined.record(side)
        torch.cuda.current_stream().wait_event(joined)  # join
        x.add_(y)
    x.fill_(2.0)
    graph.replay()
    torch.cuda.synchronize()
    assert y.tolist() == [6.0] * 4 and x.tolist() == [8.0] * 4


def test_a_fork_never_joined_back_fails_the_capture(cuda):
    x = torch.ones(4, device="cuda")
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(CaptureError, match="cudaErrorStreamCaptureUnjoined") as caught:
        with torch.cuda.graph(graph):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                x.mul_(3)  # forked, never joined
    assert "x.mul_(3)" in str(caught.value)


def test_a_stream_outside_the_capture_runs_at_once(cuda):
    x = torch.zeros(4, device="cuda")
    side = torch.cuda.Stream()  # never waits on the capturing stream: not part of the capture
    graph = torch.cuda.CUDAGraph()
    with pytest.warns(UserWarning, match="The CUDA Graph is empty"):  # nothing was captured
        with torch.cuda.graph(graph):
            with torch.cuda.stream(side):
                x.add_(5)
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    assert x.tolist() == [5.0] * 4
