"""A sampler drawing from a `torch.Generator` of its own inside a captured decode step (FlashInfer
#2132, PyTorch #46148). CUDA's graph-safe generators: registered with the graph
(`graph.register_generator_state`), each replay draws fresh values; unregistered, the capture is
refused ("Attempt to increase offset for a CUDA generator not in capture mode."). The lint judges
both alike: the registered sampler is clean, the unregistered one named."""

from __future__ import annotations

import pytest
import torch

from harness.check import capture_lint
from harness.check.lint import RANDOM
from harness.graphs import CaptureError


class Sampler:
    def __init__(self, *, register: bool) -> None:
        self.gen = torch.Generator(device="cuda")
        self.gen.manual_seed(7)
        self.logits = torch.randn(4, 32, device="cuda")
        self.tokens = torch.zeros(4, dtype=torch.long, device="cuda")
        self.graph = torch.cuda.CUDAGraph()
        if register:
            self.graph.register_generator_state(self.gen)

    def sample(self) -> None:
        probs = self.logits.softmax(-1)
        noise = torch.empty_like(probs).exponential_(generator=self.gen)
        self.tokens.copy_(probs.div(noise).argmax(-1))

    def capture(self) -> None:
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph):
            self.sample()


def test_an_unregistered_generator_is_refused_at_capture_with_cudas_words():
    sampler = Sampler(register=False)
    with pytest.raises((CaptureError, RuntimeError), match="not in capture mode") as caught:
        sampler.capture()
    assert "register_generator_state" in str(caught.value)
    assert "test_sampler_private_generator.py" in str(caught.value)


def test_a_registered_generator_draws_fresh_values_at_every_replay():
    sampler = Sampler(register=True)
    sampler.capture()
    draws = []
    for _ in range(6):
        sampler.graph.replay()
        draws.append(tuple(sampler.tokens.tolist()))
    assert len(set(draws)) > 1  # 32 tokens per row, 4 rows: six equal draws would be a frozen offset


def test_the_lint_names_the_unregistered_generator_and_passes_the_registered_one():
    unregistered, registered = Sampler(register=False), Sampler(register=True)
    flagged = capture_lint(unregistered.sample)
    clean = capture_lint(registered.sample, context=(registered.graph,), generators=(registered.gen,))
    assert flagged.stopped is None and clean.stopped is None
    assert [h.op for h in flagged.hazards if h.kind == RANDOM] == ["aten.exponential_.default"]
    assert RANDOM not in clean.kinds(), clean
