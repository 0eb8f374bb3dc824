"""capture_lint and samplers that draw from a torch.Generator of their own: registered with the graph
(`graph.register_generator_state`) they are no hazard, unregistered they are (CUDA refuses the
capture). Each test runs on the plain cpu device, on the emulated CUDA device and on CUDA when
present, where the lint must run through without a device error."""

from __future__ import annotations

import contextlib

import pytest
import torch

import harness
from harness.check import capture_lint
from harness.check.lint import RANDOM
from harness.emulation import emulation_active

DEVICES = [
    pytest.param("emulated", id="emulated-cuda"),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs CUDA")]),
]


def _device_context(kind: str):
    """The emulated CUDA device (the session's under --emulate-cuda), or the real one."""
    if kind == "emulated" and emulation_active() is None:
        if torch.cuda.is_available():
            pytest.skip("a real GPU: the emulated CUDA device is checked without one")
        return harness.emulate_cuda(device="cpu")
    return contextlib.nullcontext()


def _sampler(gen: torch.Generator):
    """A vLLM-style sampler over logits it does not hold: exponential race, arg max."""
    logits = torch.randn(3, 16, device="cuda")
    out = torch.zeros(3, dtype=torch.long, device="cuda")

    def sample() -> None:
        probs = logits.softmax(-1)
        q = torch.empty_like(probs).exponential_(generator=gen)
        out.copy_(probs.div(q).argmax(-1))

    return sample


@pytest.mark.parametrize("kind", DEVICES)
def test_a_registered_private_generator_is_no_hazard(kind):
    with _device_context(kind):
        gen = torch.Generator(device="cuda")
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(gen)
        report = capture_lint(_sampler(gen), generators=(gen,))
    assert report.stopped is None, report
    assert RANDOM not in report.kinds(), report


@pytest.mark.parametrize("kind", DEVICES)
def test_an_unregistered_private_generator_is_named_with_cudas_refusal(kind):
    with _device_context(kind):
        gen = torch.Generator(device="cuda")
        report = capture_lint(_sampler(gen))
    assert report.stopped is None, report
    [hazard] = [h for h in report.hazards if h.kind == RANDOM]
    assert hazard.op == "aten.exponential_.default"
    assert "not in capture mode" in hazard.detail and "register_generator_state" in hazard.detail
    assert "test_lint_generators.py" in hazard.where


def test_the_emulated_graph_in_context_tells_the_lint_what_it_registered():
    with _device_context("emulated"):
        gen = torch.Generator(device="cuda")
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(gen)
        report = capture_lint(_sampler(gen), context=(graph,))
    assert RANDOM not in report.kinds(), report
