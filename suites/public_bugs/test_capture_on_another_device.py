"""A graph captured on the current device's stream for a module that lives on another device
(PyTorch #87894, "Silent failure when graphs capture attempted on wrong device"; NVlabs alpamayo1.5
#38, "Fix CUDA graph capture on non-current device": an expert on cuda:1 while the process's current
device is cuda:0; vLLM #10608: capture-time data made on the default device). `torch.cuda.graph`
captures on a stream of the current device, but the expert's kernels go to cuda:1's current stream,
so they run once at capture and the graph is empty: every replay leaves the capture step's output
in place. Nothing is refused; torch warns that the graph is empty, on CUDA and on the emulated
device alike, and the replayed steps differ from eager. Fixed: capture (and replay) under the
expert's device, on a stream of that device.

Runs on two emulated devices, or natively where two GPUs are lent (the graph sanitizer's captures
are emulated and would record the other device's work: see test_ops_on_their_device.py)."""

from __future__ import annotations

import warnings

import pytest
import torch

import harness
from harness.emulation import emulation_active

EMPTY = "The CUDA Graph is empty"
EXPERT = "cuda:1"


@pytest.fixture(autouse=True)
def harness_device():
    """Two emulated devices, or CUDA with two GPUs (the conftest's fixture, overridden)."""
    if emulation_active() is None and not torch.cuda.is_available():
        with harness.emulate_cuda(device_count=2):
            yield
        return
    if emulation_active() not in (None, "cpu") or torch.cuda.device_count() < 2:
        pytest.skip("needs two devices: two GPUs natively, or two emulated ones")
    yield


class Expert:
    """A module on its own device with a graphed step: static input, weight and output."""

    def __init__(self, *, on_its_device: bool) -> None:
        self.device = torch.device(EXPERT)
        self.weight = torch.arange(8, dtype=torch.float32, device=self.device)
        self.x = torch.zeros(8, device=self.device)
        self.out = torch.zeros(8, device=self.device)
        self.graph = torch.cuda.CUDAGraph()
        self.x.fill_(1.0)  # the capture step's input
        torch.cuda.synchronize(self.device)
        if on_its_device:
            with torch.cuda.device(self.device):
                self._capture(torch.cuda.Stream(device=self.device))
        else:
            self._capture(None)  # torch.cuda.graph's own stream: the current device's, cuda:0
        torch.cuda.synchronize(self.device)

    def _capture(self, stream) -> None:
        with torch.cuda.graph(self.graph, stream=stream):
            self.forward()

    def forward(self) -> None:
        self.out.copy_(self.x * self.weight + 1)

    def graphed(self, inputs: list[float]) -> list[list[float]]:
        outs = []
        for value in inputs:
            self.x.fill_(value)
            with torch.cuda.device(self.device):
                self.graph.replay()
            outs.append(self.out.tolist())
        return outs

    def eager(self, inputs: list[float]) -> list[list[float]]:
        outs = []
        for value in inputs:
            self.x.fill_(value)
            self.forward()
            outs.append(self.out.tolist())
        return outs


def _built(on_its_device: bool) -> tuple[Expert, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        expert = Expert(on_its_device=on_its_device)
    return expert, [str(w.message) for w in caught]


def test_a_capture_on_the_current_devices_stream_is_empty_and_replays_stale_output():
    assert torch.cuda.current_device() == 0
    expert, caught = _built(on_its_device=False)
    assert any(EMPTY in message for message in caught), caught
    graphed = expert.graphed([2.0, 3.0])
    assert graphed == [[float(i + 1) for i in range(8)]] * 2  # the capture step's output, twice
    assert graphed != Expert(on_its_device=False).eager([2.0, 3.0])


def test_a_capture_on_the_experts_device_replays_each_step():
    expert, caught = _built(on_its_device=True)
    assert not any(EMPTY in message for message in caught), caught
    assert expert.graphed([2.0, 3.0]) == expert.eager([2.0, 3.0])
    assert expert.graphed([4.0])[0][2] == 9.0
