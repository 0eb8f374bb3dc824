"""`harness.check.count_replays()`: the captures and replays of `torch.cuda` graphs issued inside
the region, on the emulated CUDA device and in the graph sanitizer (the same rows run there on a
GPU), without keeping a counted graph alive."""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest
import torch

import harness
from harness.check import count_replays
from harness.emulation import emulation_active


@pytest.fixture
def device():
    """The session's emulation under --emulate-cuda, else one of our own (the graph sanitizer on
    a machine with a GPU, the emulated device without)."""
    with contextlib.nullcontext() if emulation_active() is not None else harness.emulate_cuda():
        yield


def _captured(x: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out = x * 2
    return graph, out


def test_captures_and_replays_are_counted_per_graph(device):
    x = torch.ones(4, device="cuda")
    first, _ = _captured(x)
    with count_replays() as counted:
        second, out = _captured(x)
        first.replay()
        second.replay()
        second.replay()
    first.replay()  # after the region: not counted
    assert (counted.captures, counted.replays, counted.per_graph) == (1, 3, (1, 2)), counted
    assert out.tolist() == [2.0] * 4


def test_a_failed_capture_is_not_counted(device):
    caller_stream = torch.cuda.current_stream()
    with count_replays() as counted:
        try:
            with pytest.raises(RuntimeError):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    torch.cuda.synchronize()  # refused during capture: the capture fails
        finally:
            # torch.cuda.graph leaves its side stream current when capture_end raises.
            torch.cuda.set_stream(caller_stream)
    assert counted.captures == 0 and counted.replays == 0, counted


def test_a_counted_graph_is_not_kept_alive(device):
    x = torch.ones(4, device="cuda")
    with count_replays() as counted:
        graph, _ = _captured(x)
        graph.replay()
        gone = weakref.ref(graph)
        del graph
        gc.collect()
        assert gone() is None
        again, _ = _captured(x)  # may take the collected graph's id: a new entry all the same
        again.replay()
    assert counted.per_graph == (1, 1), counted


def test_outside_the_emulation_it_refuses_with_the_remedy():
    if emulation_active() is not None:
        pytest.skip("the session runs inside harness.emulate_cuda()")
    with pytest.raises(RuntimeError, match="enter it first"):
        with count_replays():
            pass
