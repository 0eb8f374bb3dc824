"""A capture-size ladder that leaves out an off-stride maximum batch size (vllm-ascend #16049,
"off-stride `max_num_seqs` silently disables ACL graph capture for the largest batches (~7.5x
slower decode)": https://github.com/vllm-project/vllm-ascend/issues/16049, fixed by #16692:
https://github.com/vllm-project/vllm-ascend/pull/16692; the wrong bucket ladder of the reference
notes, vLLM #37865: https://github.com/vllm-project/vllm/pull/37865). The runner captures
`[1, 2, 4] + [8, 16, ...]` up to `max_num_seqs`; with `max_num_seqs = 12` the ladder ends at 8,
and every batch of 9 to 12 requests finds no graph that holds it and runs eagerly. Eager is right:
the outputs equal the graphed ones and nothing is refused, on CUDA as on the emulated device; only
the lost replays show it, and `count_replays()` counts none for those steps. Fixed: the maximum
is captured too when it is off the stride (vLLM's rule: "the max batch size is captured even when
off-stride")."""

from __future__ import annotations

import torch

from harness.check import count_replays

MAX_NUM_SEQS, HIDDEN = 12, 8
BATCHES = (3, 8, 10, 12)  # the scheduler's steps


def capture_sizes(max_num_seqs: int, *, appends_the_maximum: bool) -> list[int]:
    sizes = [s for s in [1, 2, 4] + [8 * i for i in range(1, 65)] if s <= max_num_seqs]
    if appends_the_maximum and sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


class DecodeRunner:
    def __init__(self, *, appends_the_maximum: bool) -> None:
        self.sizes = capture_sizes(MAX_NUM_SEQS, appends_the_maximum=appends_the_maximum)
        self.w = torch.randn(HIDDEN, HIDDEN, device="cuda")
        self.x = torch.zeros(MAX_NUM_SEQS, HIDDEN, device="cuda")
        self.out = torch.zeros(MAX_NUM_SEQS, HIDDEN, device="cuda")
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        for size in reversed(self.sizes):
            self._forward(size)  # warmup
            graph = torch.cuda.CUDAGraph()
            torch.cuda.synchronize()
            with torch.cuda.graph(graph):
                self._forward(size)
            self.graphs[size] = graph

    def _forward(self, batch: int) -> None:
        self.out[:batch].copy_(torch.relu(self.x[:batch] @ self.w))

    def step(self, hidden: torch.Tensor) -> torch.Tensor:
        batch = hidden.shape[0]
        padded = next((s for s in self.sizes if s >= batch), None)
        self.x[:batch].copy_(hidden)
        if padded is None:
            self._forward(batch)  # no graph holds the batch: the silent eager path
        else:
            self.x[batch:padded].zero_()
            self.graphs[padded].replay()
        return self.out[:batch].clone()


def _serve(runner: DecodeRunner) -> list[torch.Tensor]:
    return [runner.step(torch.full((batch, HIDDEN), float(batch), device="cuda")) for batch in BATCHES]


def _expected(runner: DecodeRunner) -> list[torch.Tensor]:
    return [torch.relu(torch.full((batch, HIDDEN), float(batch), device="cuda") @ runner.w)
            for batch in BATCHES]


def test_the_ladder_ends_below_an_off_stride_maximum():
    assert capture_sizes(MAX_NUM_SEQS, appends_the_maximum=False) == [1, 2, 4, 8]
    assert capture_sizes(16, appends_the_maximum=False)[-1] == 16  # on the stride: no gap


def test_batches_above_the_last_size_replay_nothing_and_are_right():
    runner = DecodeRunner(appends_the_maximum=False)
    with count_replays() as counted:
        outputs = _serve(runner)
    for got, want in zip(outputs, _expected(runner)):
        torch.testing.assert_close(got, want)  # eager is right: tokens would compare equal
    assert counted.replays == 2, counted  # the batches of 3 and 8; 10 and 12 ran eagerly
    assert counted.captures == 0


def test_capturing_the_maximum_replays_every_step():
    runner = DecodeRunner(appends_the_maximum=True)
    assert runner.sizes == [1, 2, 4, 8, 12]
    with count_replays() as counted:
        outputs = _serve(runner)
    assert counted.replays == len(BATCHES), counted
    for got, want in zip(outputs, _expected(runner)):
        torch.testing.assert_close(got, want)
