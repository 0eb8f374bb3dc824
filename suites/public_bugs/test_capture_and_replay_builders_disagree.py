"""Capture-time and replay-time metadata builders that disagree (SGLang #21987): the capture batch
of a speculative verify step is uniform (two query tokens per request), so its builder picks the
uniform layout, a reshape by a Python `q_len`, and the graph keeps that choice; the replay-time
builder writes a variable layout (`cu_seqlens_q` = [0, 1, 4]) into the captured buffer, which the
captured reshape never reads. Nothing to refuse (CUDA replays the uniform kernel too): the
outputs differ from eager's (what a comparison of generations catches), and `explain_against_eager`
names the first replayed op the eager step never runs, with its line (since 2026-12-06: before,
it said only that no replayed op departs from eager). Fixed: one builder, whose captured kernel reads
`cu_seqlens_q` for every batch, so capture and replay agree on the layout."""

from __future__ import annotations

import pytest
import torch

from harness.check.explain_cuda import explain_against_eager

TOKENS = 4  # the padded token budget of the captured batch of 2 requests


class VerifyStep:
    """Sums each request's query tokens (the stand-in for attention over its query span)."""

    def __init__(self, *, one_builder: bool) -> None:
        self.one_builder = one_builder
        self.q = torch.zeros(TOKENS, device="cuda")
        self.cu_seqlens_q = torch.zeros(3, dtype=torch.long, device="cuda")
        self.out = torch.zeros(2, device="cuda")

    def build(self, q_lens: list[int]) -> int | None:
        """Fill the captured buffers for `q_lens`; the uniform `q_len` when this builder takes the
        uniform layout, else None."""
        starts = [0]
        for n in q_lens:
            starts.append(starts[-1] + n)
        self.cu_seqlens_q.copy_(torch.tensor(starts, device="cuda"))
        self.q.copy_(torch.arange(1.0, TOKENS + 1, device="cuda"))
        uniform = len(set(q_lens)) == 1 and not self.one_builder
        return q_lens[0] if uniform else None

    def forward(self, q_len: int | None) -> None:
        if q_len is not None:  # the uniform layout: request r owns tokens [r*q_len, (r+1)*q_len)
            self.out.copy_(self.q.view(-1, q_len).sum(-1))
            return
        token = torch.arange(TOKENS, device="cuda")
        owner = torch.searchsorted(self.cu_seqlens_q[1:], token, right=True)
        real = token < self.cu_seqlens_q[-1]
        self.out.zero_().index_add_(0, owner.clamp(max=1), torch.where(real, self.q, 0.0))

    def prepare_capture(self) -> "VerifyStep":
        self.capture_q_len = self.build([2, 2])  # the capture batch
        return self

    def graphed(self) -> torch.Tensor:
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            self.forward(self.capture_q_len)
        self.build([1, 3])  # the replay builder writes the real batch into the captured buffers
        graph.replay()
        return self.out

    def eager(self) -> torch.Tensor:
        self.forward(self.build([1, 3]))  # the real batch, its layout built for it
        return self.out


def _explained(*, one_builder: bool):
    graphed = VerifyStep(one_builder=one_builder).prepare_capture()
    return explain_against_eager(graphed.graphed, VerifyStep(one_builder=one_builder).eager)


@pytest.mark.explains_against_eager
def test_the_graph_keeps_the_capture_builders_layout():
    graphed = VerifyStep(one_builder=False).prepare_capture().graphed().tolist()
    eager = VerifyStep(one_builder=False).eager().tolist()
    assert graphed == [3.0, 7.0] and eager == [1.0, 9.0]  # [1+2, 3+4] where eager sums [1, 2+3+4]
    found = _explained(one_builder=False)
    # No replayed op computes otherwise than an eager op of its line: the graph runs a path the
    # eager step never takes, and the explanation names its first op and line.
    assert not found.diverged and found.replays_compared == 1, found
    assert "self.q.view(-1, q_len)" in found.first_unmatched, found
    assert "a choice made on the host at capture" in str(found)


@pytest.mark.explains_against_eager
def test_one_builder_reading_cu_seqlens_agrees_with_eager():
    found = _explained(one_builder=True)
    assert not found.diverged and found.replays_compared == 1, found
    assert found.first_unmatched == "", found
    assert VerifyStep(one_builder=True).prepare_capture().graphed().tolist() == [1.0, 9.0]
