"""A sampling kernel that takes its Philox seed and offset as host integers (FlashInfer #2132 and
#2432: `get_seed_and_offset` read on the host at each call; sglang-omni #415): captured once, the
graph bakes the capture step's offset, so every replay draws the same noise and samples the same
tokens, where eager advances the offset at each step. Nothing to refuse (CUDA bakes the kernel
arguments too): `explain_against_eager` names the noise op, its line and the frozen host value.
Fixed: seed and offset live in a device tensor the runtime advances before each replay (the
tensor form of FlashInfer #2432), and the graph reads it."""

from __future__ import annotations

import pytest
import torch

from harness.check.causes import HOST_VALUE_FROZEN
from harness.check.explain_cuda import explain_against_eager

VOCAB, STEPS = 64, 3


def _noise(seed, offset) -> torch.Tensor:
    """Uniform noise from a counter hash of (seed, offset, position): the stand-in for Philox.
    `seed` and `offset` are host ints or 0-dim device tensors."""
    position = torch.arange(VOCAB, device="cuda", dtype=torch.int64)
    mixed = (position + offset * VOCAB) * 2654435761 + seed
    return ((mixed % 1_000_003).to(torch.float32) + 0.5) / 1_000_003


class Sampler:
    def __init__(self, *, seed_on_device: bool) -> None:
        self.seed_on_device = seed_on_device
        self.seed = torch.cuda.default_generators[0].initial_seed() % 1_000_003
        self.offset = 0  # the host's Philox offset, advanced per call
        self.seed_offset = torch.zeros(2, dtype=torch.int64, device="cuda")
        self.probs = torch.full((VOCAB,), 1.0 / VOCAB, device="cuda")
        self.token = torch.zeros((), dtype=torch.int64, device="cuda")

    def next_seed_and_offset(self) -> tuple[int, int]:
        seed_offset = (self.seed, self.offset)
        self.offset += 1
        return seed_offset

    def sample(self) -> None:
        if self.seed_on_device:
            noise = _noise(self.seed_offset[0], self.seed_offset[1])
        else:
            noise = _noise(*self.next_seed_and_offset())  # host ints: baked at capture
        self.token.copy_((self.probs / -noise.log()).argmax())

    def advance(self) -> None:
        """Before each step: the device form's seed and offset for this step."""
        if self.seed_on_device:
            self.seed_offset.copy_(torch.tensor(self.next_seed_and_offset(), device="cuda"))

    def graphed(self) -> list[int]:
        self.advance()
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            self.sample()
        self.offset = 0  # the capture is not a step: start the steps' offsets over
        tokens = []
        for _ in range(STEPS):
            self.advance()
            graph.replay()
            tokens.append(int(self.token))
        return tokens

    def eager(self) -> list[int]:
        tokens = []
        for _ in range(STEPS):
            self.advance()
            self.sample()
            tokens.append(int(self.token))
        return tokens


@pytest.mark.explains_against_eager
def test_host_seed_and_offset_are_frozen_at_capture():
    graphed = Sampler(seed_on_device=False).graphed()
    assert len(set(graphed)) == 1, graphed  # every replay samples the capture step's token
    found = explain_against_eager(Sampler(seed_on_device=False).graphed,
                                  Sampler(seed_on_device=False).eager)
    assert found.diverged, found
    assert found.op == "aten.add.Tensor" and "offset * VOCAB" in found.where, found
    assert found.cause is not None and found.cause.kind == HOST_VALUE_FROZEN, found
    assert "= 0" in found.cause.detail and "eager passes 64" in found.cause.detail, found.cause


@pytest.mark.explains_against_eager
def test_seed_and_offset_on_the_device_advance_at_every_replay():
    graphed = Sampler(seed_on_device=True).graphed()
    assert graphed == Sampler(seed_on_device=True).eager()
    assert len(set(graphed)) > 1, graphed
    found = explain_against_eager(Sampler(seed_on_device=True).graphed,
                                  Sampler(seed_on_device=True).eager)
    assert not found.diverged, found
