"""A captured reduced loss (the docs' whole-network training step ends in `MSELoss`) replays with
no warning, as a CUDA graph's replay launches kernels and calls no operator. The emulated device
replayed these losses through their `out=` overloads, whose kernels first resize the out to the
unreduced shape and so warn "An output with one or more elements was resized" on every replay (a
Python UserWarning on torch 2.15, which `-W error` turns into a failed replay). The `cuda_kind` rows
show CUDA's own answer on a GPU."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

LOSSES = {
    "mse_loss": lambda x, y: F.mse_loss(x, y),
    "mse_loss sum": lambda x, y: F.mse_loss(x, y, reduction="sum"),
    "smooth_l1_loss": lambda x, y: F.smooth_l1_loss(x, y),
    "huber_loss": lambda x, y: F.huber_loss(x, y, reduction="sum"),
    "soft_margin_loss": lambda x, y: F.soft_margin_loss(x, y.sign()),
    "binary_cross_entropy": lambda x, y: F.binary_cross_entropy(x.sigmoid(), y.sigmoid()),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_a_captured_reduced_loss_replays_without_warning(cuda_kind, name, capfd):
    loss_of = LOSSES[name]
    x = torch.randn(16, 8, device="cuda")
    y = torch.randn(16, 8, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        loss_of(x, y)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = loss_of(x, y)
    capfd.readouterr()
    x.copy_(torch.randn(16, 8, device="cuda"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph.replay()
        torch.cuda.synchronize()
    assert [str(w.message) for w in caught] == []
    assert "was resized" not in capfd.readouterr().err
    assert loss.shape == () and torch.allclose(loss, loss_of(x, y))
