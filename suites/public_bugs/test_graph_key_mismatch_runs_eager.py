"""A dispatch key that differs between capture registration and lookup (vLLM #36165, #53407;
TensorRT-LLM #18242, #13574: graphs silently skipped): the runner captures its decode graphs
under `(batch, "decode")` and looks them up under `(padded batch, mode)` where the scheduler
spells the mode "DECODE", so every step misses and runs eagerly. CUDA accepts the eager step as
correct and its tokens equal the graphed ones: no refusal, no divergence. `count_replays()` shows
it: no replay for the steps the runtime meant to replay. Fixed: one key function for both."""

from __future__ import annotations

import torch

from harness.check import count_replays

BUCKETS, STEPS = (1, 2, 4), 3


class DecodeRunner:
    def __init__(self, *, one_key_function: bool) -> None:
        self.one_key_function = one_key_function
        self.w = torch.randn(8, 8, device="cuda")
        self.x = torch.zeros(max(BUCKETS), 8, device="cuda")
        self.out = torch.zeros(max(BUCKETS), 8, device="cuda")
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        for batch in BUCKETS:
            self._forward(batch)  # warmup
            graph = torch.cuda.CUDAGraph()
            torch.cuda.synchronize()
            with torch.cuda.graph(graph):
                self._forward(batch)
            self.graphs[self._key(batch, "decode")] = graph

    def _key(self, batch: int, mode: str) -> tuple:
        return (batch, mode.lower() if self.one_key_function else mode)

    def _forward(self, batch: int) -> None:
        self.out[:batch].copy_(torch.relu(self.x[:batch] @ self.w))

    def step(self, hidden: torch.Tensor, mode: str = "DECODE") -> torch.Tensor:
        batch = hidden.shape[0]
        padded = next(b for b in BUCKETS if b >= batch)
        self.x[:batch].copy_(hidden)
        graph = self.graphs.get(self._key(padded, mode))
        if graph is None:
            self._forward(batch)  # the silent fallback
        else:
            graph.replay()
        return self.out[:batch].clone()


def _serve(runner: DecodeRunner) -> list[torch.Tensor]:
    return [runner.step(torch.full((3, 8), float(i), device="cuda")) for i in range(STEPS)]


def test_a_lookup_key_spelled_otherwise_replays_nothing():
    runner = DecodeRunner(one_key_function=False)
    with count_replays() as counted:
        outputs = _serve(runner)
    expected = [torch.relu(torch.full((3, 8), float(i), device="cuda") @ runner.w) for i in range(STEPS)]
    for got, want in zip(outputs, expected):
        torch.testing.assert_close(got, want)  # eager is right: tokens would compare equal
    assert counted.replays == 0, counted


def test_one_key_function_replays_every_step():
    runner = DecodeRunner(one_key_function=True)
    with count_replays() as counted:
        outputs = _serve(runner)
    assert counted.replays == STEPS and counted.per_graph == (STEPS,), counted
    assert counted.captures == 0  # all captured before the region
    torch.testing.assert_close(outputs[-1], torch.relu(torch.full((3, 8), 2.0, device="cuda") @ runner.w))
