"""An op runs on its tensors' device, on that device's current stream, whatever the current device
is (ATen's device guard): during a capture on one device's stream, work on another device's tensors
is not captured. It runs at once on the other device's default stream, which CUDA does not refuse
in any capture_error_mode (the legacy default stream waits only on its own device's streams), and
the graph may end up empty, with torch's warning. Checked on two emulated devices and natively on
two GPUs (PyTorch #87894 has CUDA's answer: the capture "silently fails")."""

from __future__ import annotations

import warnings
from typing import Iterator

import pytest
import torch

import harness
from harness.emulation import emulation_active

EMPTY = "The CUDA Graph is empty"


@pytest.fixture(params=["emulated", pytest.param("native", marks=pytest.mark.gpu)])
def two_devices(request) -> Iterator[str]:
    if request.param == "emulated":
        if emulation_active() is not None or torch.cuda.is_available():
            pytest.skip("a real GPU or a session device: two emulated devices are made without one")
        with harness.emulate_cuda(device="cpu", device_count=2):
            yield request.param
        return
    if emulation_active() is not None:
        pytest.skip("checks real CUDA outside any emulation")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    yield request.param


def _capture(out: torch.Tensor, x: torch.Tensor, stream: torch.cuda.Stream):
    """Capture `out = 2x` on `stream`; the graph and the warnings the capture gave."""
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize(x.device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.cuda.graph(graph, stream=stream):
            out.copy_(x * 2)
    return graph, [str(w.message) for w in caught]


def test_work_on_another_devices_tensors_runs_at_once_and_stays_out_of_the_graph(two_devices):
    x = torch.ones(8, device="cuda:1")
    out = torch.zeros(8, device="cuda:1")
    graph, caught = _capture(out, x, torch.cuda.Stream(device=0))
    torch.cuda.synchronize(1)
    assert out.tolist() == [2.0] * 8  # it ran during the capture, on cuda:1's default stream
    assert any(EMPTY in message for message in caught), caught
    x.fill_(5)
    graph.replay()
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    assert out.tolist() == [2.0] * 8  # the replay has nothing to run


def test_work_captured_on_its_own_devices_stream_replays(two_devices):
    x = torch.ones(8, device="cuda:1")
    out = torch.zeros(8, device="cuda:1")
    with torch.cuda.device(1):
        graph, caught = _capture(out, x, torch.cuda.Stream(device=1))
        assert out.tolist() == [0.0] * 8 and not any(EMPTY in m for m in caught), caught
        x.fill_(5)
        graph.replay()
        torch.cuda.synchronize(1)
    assert out.tolist() == [10.0] * 8


def test_an_op_on_the_second_device_goes_to_its_current_stream(two_devices):
    """The op's stream is the current stream of its tensors' device, not the current device's:
    a capture on cuda:1's current stream records it while cuda:0 stays the current device."""
    x = torch.ones(8, device="cuda:1")
    out = torch.zeros(8, device="cuda:1")
    capturing = torch.cuda.Stream(device=1)
    torch.cuda.synchronize(1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(capturing):  # cuda:1's current stream (and, meanwhile, the device)
        graph.capture_begin()
        torch.cuda.set_device(0)  # current device back to 0; cuda:1 keeps its current stream
        out.copy_(x * 3)
        torch.cuda.set_device(1)
        graph.capture_end()
    assert out.tolist() == [0.0] * 8
    graph.replay()
    torch.cuda.synchronize(1)
    assert out.tolist() == [3.0] * 8
