"""Padding rows leaking into real rows (SGLang #32477, #30895): a decode batch of 3 requests
replayed in the graph captured for 4, the pad row holding garbage (NaN here), masked by
multiplying (`0 * NaN` is NaN) before a batch-wide reduction (a per-column scale, as a quantised
kernel takes). `explain_against_eager`, comparing each op with what the eager run computes for the
same 3 rows (padding is not a divergence by itself), names the reduction where the pad row enters
the real rows, its line and the pad row's values. Fixed: the padding is masked with `torch.where`,
and the real rows match eager."""

from __future__ import annotations

import pytest
import torch

from harness.check.explain_cuda import explain_against_eager

CAPTURED, REAL, WIDTH = 4, 3, 8


class Decode:
    def __init__(self, *, mask_by_where: bool) -> None:
        self.mask_by_where = mask_by_where
        self.rows = torch.zeros(CAPTURED, WIDTH, device="cuda")
        self.real = torch.zeros(CAPTURED, 1, device="cuda")  # 1 for real rows, 0 for padding
        self.out = torch.zeros(CAPTURED, WIDTH, device="cuda")

    def body(self, rows: torch.Tensor) -> None:
        real = self.real[: rows.shape[0]]
        masked = torch.where(real.bool(), rows, 0.0) if self.mask_by_where else rows * real
        scale = masked.abs().amax(0, keepdim=True) + 1
        self.out[: rows.shape[0]].copy_(rows / scale)

    def batch(self) -> torch.Tensor:
        return torch.arange(float(REAL * WIDTH), device="cuda").reshape(REAL, WIDTH)

    def graphed(self) -> torch.Tensor:
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            self.body(self.rows)
        self.rows[:REAL].copy_(self.batch())
        self.rows[REAL:].fill_(float("nan"))  # what a previous batch left in the pad row
        self.real[:REAL], self.real[REAL:] = 1.0, 0.0
        graph.replay()
        return self.out[:REAL]

    def eager(self) -> torch.Tensor:
        self.real[:REAL] = 1.0
        self.body(self.batch())
        return self.out[:REAL]


def _explained(*, mask_by_where: bool):
    return explain_against_eager(Decode(mask_by_where=mask_by_where).graphed,
                                 Decode(mask_by_where=mask_by_where).eager)


@pytest.mark.explains_against_eager
def test_padding_masked_by_multiplying_is_named_where_it_enters_the_real_rows():
    found = _explained(mask_by_where=False)
    assert found.diverged, found
    assert found.op == "aten.amax.default"
    assert "test_padding_rows_leak_into_real_rows.py" in found.where and "amax" in found.where
    assert found.cause is not None and "padding rows [3:4] hold [nan" in found.cause.detail, found.cause


@pytest.mark.explains_against_eager
def test_padding_masked_with_where_leaves_the_real_rows_as_eager_computes_them():
    found = _explained(mask_by_where=True)
    assert not found.diverged, found
    assert found.replays_compared == 1 and found.ops_compared >= 4
    graphed, eager = Decode(mask_by_where=True).graphed(), Decode(mask_by_where=True).eager()
    assert torch.isfinite(graphed).all() and torch.equal(graphed, eager)
