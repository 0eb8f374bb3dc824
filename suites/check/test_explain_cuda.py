"""Explain under `harness.emulate_cuda()`: code on the emulated "cuda" device whose graphs the
`emulated` backend captures through torch.cuda is explained op by op as on the cpu (the first
divergent op, its line, the cause), through the emulated CUDAGraph's public recording."""

from __future__ import annotations

import inspect
import os

import torch

import harness
from harness.check import explain_divergence
from harness.check.causes import BUFFER_REBOUND, HOST_VALUE_FROZEN


def _line_of(snippet: str) -> str:
    lines, _ = inspect.getsourcelines(inspect.getmodule(_line_of))
    number = next(i for i, line in enumerate(lines, 1) if snippet in line and "_line_of" not in line)
    return f"{os.path.relpath(__file__)}:{number}"


def _host_int_step(backend, change: bool):
    assert backend.device.type == "cuda", backend.device
    x = torch.arange(8, dtype=torch.float32, device="cuda")
    length = [4]
    graph = backend.capture(lambda: (x * 2)[: length[0]].sum())  # the slice length is a host int
    graph.replay()
    if change:
        length[0] = 6
    graph.replay()


def test_a_host_int_frozen_at_capture_is_named_on_the_emulated_device():
    with harness.emulate_cuda():
        explanation = explain_divergence(_host_int_step, True)
        clean = explain_divergence(_host_int_step, False)
    assert explanation.diverged and explanation.op == "aten.sum.default", explanation
    assert explanation.where.startswith(_line_of("(x * 2)[: length[0]].sum()")), explanation.where
    assert explanation.cause.kind == HOST_VALUE_FROZEN, explanation
    assert not clean.diverged and clean.replays_compared == 2 and clean.ops_compared == 4, clean


class Weights:
    def __init__(self) -> None:
        self.scale = torch.full((8,), 2.0, device="cuda")


def test_a_buffer_rebound_since_capture_is_named_on_the_emulated_device():
    with harness.emulate_cuda():
        weights = Weights()
        kept = []

        def step(backend):
            x = torch.ones(8, device="cuda")
            graph = backend.capture(lambda: x * weights.scale)
            graph.replay()
            kept.append(weights.scale)
            weights.scale = torch.full((8,), 3.0, device="cuda")  # the planted bug
            graph.replay()

        explanation = explain_divergence(step, roots=lambda: {"weights": weights})
    assert explanation.diverged and explanation.op == "aten.mul.Tensor", explanation
    assert explanation.where.startswith(_line_of("lambda: x * weights.scale")), explanation.where
    assert explanation.cause.kind == BUFFER_REBOUND, explanation
    assert "where `weights.scale` was at capture" in explanation.cause.detail


def test_the_emulated_cuda_graph_keeps_its_recording_when_asked():
    with harness.emulate_cuda():
        x = torch.ones(4, device="cuda")
        plain, traced = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        traced.keep_trace()
        assert plain.recording is None
        for graph in (plain, traced):
            with torch.cuda.graph(graph):
                y = x * 2
        assert plain.recording.records == ()
        assert [r.op for r in traced.recording.records] == ["aten.mul.Tensor"]
        seen = []
        traced.replay_observed(lambda record: seen.append(("before", record.op)),
                               lambda record: seen.append(("after", float(record.outputs[0].sum()))))
        assert seen == [("before", "aten.mul.Tensor"), ("after", 8.0)]
        assert float(y.sum()) == 8.0
        traced.reset()
        assert traced.recording is None

