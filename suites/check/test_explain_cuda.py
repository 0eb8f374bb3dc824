"""Explain under `harness.emulate_cuda()`: code on the emulated "cuda" device whose graphs the
`emulated` backend captures through torch.cuda is explained op by op as on the cpu (the first
divergent op, its line, the cause), through the emulated CUDAGraph's public recording; code that
captures its own torch.cuda graphs is explained against its own eager path (explain_cuda.py)."""

from __future__ import annotations

import inspect
import os

import pytest
import torch

import harness
from harness.check import explain_divergence
from harness.check.causes import BUFFER_REBOUND, HOST_VALUE_FROZEN


def _on_the_emulated_device():
    """`harness.emulate_cuda(device="cpu")`, or the session's own under `--emulate-cuda`; on a machine
    with a GPU the test is skipped (there the context is the graph sanitizer)."""
    import contextlib

    from harness.emulation import emulation_active

    if emulation_active() == "cpu":
        return contextlib.nullcontext()
    if emulation_active() is not None or torch.cuda.is_available():
        pytest.skip("a real GPU: explain on the emulated CUDA device is checked without one")
    return harness.emulate_cuda(device="cpu")


def _line_of(snippet: str) -> str:
    lines, _ = inspect.getsourcelines(inspect.getmodule(_line_of))
    number = next(i for i, line in enumerate(lines, 1) if snippet in line and "_line_of" not in line)
    return f"{os.path.relpath(__file__)}:{number}"


def _host_int_step(backend, change: bool):
    assert backend.device.type == "cuda", backend.device
    x = torch.arange(8, dtype=torch.float32, device="cuda")
    window = {"length": 4}
    graph = backend.capture(lambda: x.narrow(0, 0, window["length"]).sum())  # a host int frozen
    for length in (4, 6 if change else 4):
        window["length"] = length
        graph.replay()


@pytest.mark.explains_against_eager
def test_a_host_int_frozen_at_capture_is_named_on_the_emulated_device():
    with _on_the_emulated_device():
        explanation = explain_divergence(_host_int_step, True, device="cuda")
        clean = explain_divergence(_host_int_step, False, device="cuda")
    assert explanation.diverged and explanation.op == "aten.sum.default", explanation
    assert explanation.where.startswith(_line_of('x.narrow(0, 0, window["length"]).sum()')), explanation.where
    assert explanation.cause.kind == HOST_VALUE_FROZEN, explanation
    assert not clean.diverged and clean.replays_compared == 2 and clean.ops_compared == 2, clean


class Weights:
    def __init__(self) -> None:
        self.scale = torch.full((8,), 2.0, device="cuda")


@pytest.mark.explains_against_eager
def test_a_buffer_rebound_since_capture_is_named_on_the_emulated_device():
    with _on_the_emulated_device():
        weights = Weights()
        kept = []

        def step(backend):
            x = torch.ones(8, device="cuda")
            graph = backend.capture(lambda: x * weights.scale)
            graph.replay()
            kept.append(weights.scale)
            weights.scale = torch.full((8,), 3.0, device="cuda")  # the planted bug
            graph.replay()

        explanation = explain_divergence(step, roots=lambda: {"weights": weights}, device="cuda")
    assert explanation.diverged and explanation.op == "aten.mul.Tensor", explanation
    assert explanation.where.startswith(_line_of("lambda: x * weights.scale")), explanation.where
    assert explanation.cause.kind == BUFFER_REBOUND, explanation
    assert "where `weights.scale` was at capture" in explanation.cause.detail


@pytest.mark.explains_against_eager
def test_the_emulated_cuda_graph_keeps_its_recording_when_asked():
    with _on_the_emulated_device():
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



# --- code that captures its own graphs with torch.cuda, explained against its own eager path -------

class Runner:
    """A runtime written against torch.cuda: a static input buffer, one graph, replays after
    copying each step's input in; `rebind` plants the bug of rebinding the buffer instead."""

    def __init__(self, graphed: bool, rebind: bool = False) -> None:
        generator = torch.Generator().manual_seed(0)
        self.weight = torch.randn(8, 8, generator=generator).to("cuda")
        self.graphed, self.rebind, self.kept = graphed, rebind, []
        if graphed:
            self.static = torch.zeros(4, 8, device="cuda")
            self.forward(self.static)  # warmup
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = self.forward(self.static)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ self.weight)  # the line the graph captures and eager runs alike

    def step(self, x: torch.Tensor) -> torch.Tensor:
        if not self.graphed:
            return self.forward(x).clone()
        if self.rebind:
            self.kept.append(self.static)  # the old buffer stays alive, as a runtime's old references do
            self.static = torch.zeros_like(self.static)  # the planted bug: rebound, not copied into
        self.static.copy_(x)
        self.graph.replay()
        return self.out.clone()


def _explain_runner(rebind: bool, **more_roots):
    from harness.check.explain_cuda import explain_against_eager

    runners = []

    def run(graphed: bool):
        runner = Runner(graphed, rebind)
        runners.append(runner)
        for i in range(3):
            runner.step(torch.full((4, 8), float(i + 1), device="cuda"))

    with _on_the_emulated_device():
        return explain_against_eager(lambda: run(True), lambda: run(False),
                                     roots=lambda: {**more_roots, "runner": runners[-1]})


@pytest.mark.explains_against_eager
def test_a_static_input_rebound_in_user_cuda_graph_code_is_named():
    explanation = _explain_runner(rebind=True)
    assert explanation.diverged and explanation.op == "aten.mm.default", explanation
    assert explanation.where.startswith(_line_of("return torch.relu(x @ self.weight)")), explanation.where
    assert explanation.graph == "graph 1, replay 1", explanation
    assert explanation.cause.kind == BUFFER_REBOUND, explanation
    assert "(now `runner.kept[0]`)" in explanation.cause.detail, explanation.cause.detail
    assert "the values eager reads are in `runner.static`, another buffer" in explanation.cause.detail


class Block:
    """A block of a linked list by `prev`, as a caching allocator chains the blocks of a segment."""

    def __init__(self, prev: "Block | None") -> None:
        self.prev = prev


class Machinery:
    """An object whose private attribute holds a structure too deep to walk."""

    def __init__(self, blocks: Block) -> None:
        self._blocks = blocks


def _chain(length: int) -> Block:
    block = None
    for _ in range(length):
        block = Block(block)
    return block


@pytest.mark.explains_against_eager
def test_a_root_nested_too_deep_is_skipped_and_reported_while_the_rest_is_walked():
    # The example runtime's emulated CUDAGraph reaches the device's allocator, whose blocks chain
    # by `prev` beyond the walk's depth; the divergence must still be named, the deep path listed.
    explanation = _explain_runner(rebind=True, allocator=_chain(100), device=Machinery(_chain(100)))
    assert explanation.diverged and explanation.op == "aten.mm.default", explanation
    assert explanation.cause.kind == BUFFER_REBOUND, explanation
    assert "the values eager reads are in `runner.static`, another buffer" in explanation.cause.detail
    assert explanation.paths_not_walked == ("allocator" + ".prev" * 64,), explanation.paths_not_walked
    assert "1 paths under the roots nested too deep to name tensors by were skipped" in str(explanation)


@pytest.mark.explains_against_eager
def test_user_cuda_graph_code_without_the_bug_agrees_with_its_eager_path():
    explanation = _explain_runner(rebind=False)
    assert not explanation.diverged and not explanation.raised, explanation
    assert explanation.replays_compared == 3 and explanation.ops_compared >= 6, explanation


def _example_module(name: str):
    """A module of examples/cuda_runtime/ (a project of its own: imported from its folder)."""
    import importlib
    import sys
    from pathlib import Path

    folder = str(Path(__file__).resolve().parents[2] / "examples" / "cuda_runtime")
    sys.path.insert(0, folder)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(folder)


def _explain_example(rebind: bool):
    from harness.check.explain_cuda import explain_against_eager

    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10], [11, 12], [13, 14, 15]]
    with _on_the_emulated_device():
        ModelRunner = _example_module("model_runner").ModelRunner
        RebindsInputs = _example_module("planted").RebindsInputs  # the example suite's planted bug
        runners = []

        def graphed():
            runners.append((RebindsInputs if rebind else ModelRunner)())
            runners[-1].generate(prompts, 4)

        try:
            return explain_against_eager(graphed, lambda: ModelRunner(enforce_eager=True).generate(prompts, 4),
                                         roots=lambda: {"runner": runners[-1]})
        finally:
            torch.set_default_device(None)  # the runner leaves set_default_device("cpu") behind


@pytest.mark.explains_against_eager
@pytest.mark.slow
def test_the_example_runtimes_rebound_input_is_named_at_the_embedding():
    explanation = _explain_example(rebind=True)
    assert explanation.diverged and explanation.op == "aten.index.Tensor", explanation
    assert explanation.where.startswith("examples/cuda_runtime/tiny_model.py:") and \
        "self.embed[input_ids]" in explanation.where, explanation.where
    assert explanation.cause.kind == BUFFER_REBOUND, explanation
    assert "the values eager reads are in `runner.graph_vars['input_ids']`" in explanation.cause.detail


@pytest.mark.explains_against_eager
@pytest.mark.slow
def test_the_example_runtime_without_the_bug_agrees_with_its_eager_path():
    explanation = _explain_example(rebind=False)
    assert not explanation.diverged and not explanation.raised, explanation
    assert explanation.replays_compared > 0, explanation


@pytest.mark.explains_against_eager
@pytest.mark.slow
def test_the_transformers_sliding_window_mask_is_named_on_the_emulated_device():
    import warnings

    from harness.adapters.transformers import TransformersRuntime
    from harness.audit.classify import MAX_CACHE_LEN, PROMPTS, requests
    from harness.audit.tiny import Architecture, build_tiny

    with _on_the_emulated_device(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_tiny(Architecture("mistral", "MistralForCausalLM"), torch.bfloat16).to("cuda")
        explanation = explain_divergence(
            lambda backend: TransformersRuntime(model, backend=backend, graph_sizes=(len(PROMPTS),),
                                                max_cache_len=MAX_CACHE_LEN),
            requests=requests(), device="cuda")
    assert explanation.diverged and "transformers/masking_utils.py" in explanation.where, explanation
    assert explanation.cause.kind == HOST_VALUE_FROZEN and "the value it had at capture" in explanation.cause.detail
