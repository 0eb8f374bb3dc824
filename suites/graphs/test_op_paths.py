"""Ops that CUDA captures where a CPU kernel would sync, and ops refused for a reason the error must
name. `F.one_hot(x, num_classes=n)` captures on CUDA (its CUDA kernel skips the class-range check);
fp32 `torch._grouped_mm` fails on CUDA because its non-bf16 fallback copies `offs` to the host."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from harness.graphs import CaptureError

MODES = [pytest.param(torch.no_grad, id="no_grad"), pytest.param(torch.inference_mode, id="inference"),
         pytest.param(contextlib.nullcontext, id="grad")]


@pytest.mark.parametrize("mode", MODES)
def test_one_hot_with_num_classes_captures(backend, mode):
    labels = torch.tensor([2, 0, 3], device=backend.device)
    with mode():
        graph = backend.capture(lambda: F.one_hot(labels, num_classes=5))
    labels.copy_(torch.tensor([4, 1, 1]))
    graph.replay()
    backend.synchronize()
    assert torch.equal(graph.output, F.one_hot(labels, num_classes=5))


def test_one_hot_without_num_classes_is_refused(backend):
    labels = torch.tensor([2, 0, 3], device=backend.device)
    with pytest.raises(CaptureError):
        backend.capture(lambda: F.one_hot(labels))


class DenseRoutedExperts(torch.nn.Module):
    """A tiny mixture of experts routed with one_hot (as Mixtral-style blocks build their expert
    masks): every expert runs on every token, weighted by the routing gates."""

    def __init__(self, hidden: int = 16, experts: int = 4, top_k: int = 2) -> None:
        super().__init__()
        self.router = torch.nn.Linear(hidden, experts, bias=False)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(experts))
        self.num_experts, self.top_k = experts, top_k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.router(x).softmax(-1).topk(self.top_k, dim=-1)
        mask = F.one_hot(chosen, num_classes=self.num_experts).to(x.dtype)  # (tokens, k, experts)
        gates = (mask * weights.unsqueeze(-1)).sum(1)
        return sum(gates[:, e:e + 1] * expert(x) for e, expert in enumerate(self.experts))


def test_experts_routed_with_one_hot_replay_as_eager(backend):
    torch.manual_seed(0)
    model = DenseRoutedExperts().to(backend.device)
    x = torch.randn(6, 16, device=backend.device)
    with torch.no_grad():
        graph = backend.capture(lambda: model(x))
        x.copy_(torch.randn(6, 16))
        graph.replay()
        backend.synchronize()
        torch.testing.assert_close(graph.output, model(x))


class GroupedExperts(torch.nn.Module):
    """transformers' grouped-GEMM experts path: tokens sorted by expert, one `torch._grouped_mm`
    over the expert weights with per-expert offsets."""

    def __init__(self, hidden: int = 16, experts: int = 2) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(experts, hidden, hidden) / hidden ** 0.5)

    def forward(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return torch._grouped_mm(x, self.weight.to(x.dtype), offs=offsets)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_grouped_mm_experts(backend, dtype):
    torch.manual_seed(0)
    model = GroupedExperts().to(backend.device)
    x = torch.randn(16, 16, device=backend.device, dtype=dtype)
    offsets = torch.tensor([8, 16], dtype=torch.int32, device=backend.device)
    with torch.no_grad():
        if dtype == torch.float32:
            with pytest.raises(CaptureError) as caught:
                backend.capture(lambda: model(x, offsets))
            if backend.name == "emulated":
                assert "copies `offs` to the host" in str(caught.value)
                assert "bf16" in str(caught.value) and "torch._grouped_mm(x" in str(caught.value)
            return
        graph = backend.capture(lambda: model(x, offsets))
        graph.replay()
        backend.synchronize()
        torch.testing.assert_close(graph.output, model(x, offsets))


def test_equal_on_the_same_tensor_needs_no_sync(backend):
    # CUDA's equal answers on the host when both sides are the same memory, or shapes differ.
    x = torch.arange(6.0, device=backend.device)
    seen = {}

    def fn():
        seen["same"] = torch.equal(x, x)
        seen["shapes"] = torch.equal(x, x[:3])
        return x * 2

    backend.capture(fn)
    assert seen == {"same": True, "shapes": False}
