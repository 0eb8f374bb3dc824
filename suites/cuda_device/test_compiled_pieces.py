"""A runtime's own backend that compiles each piece of a split graph with inductor's `compile_fx`
and captures the compiled piece in `torch.cuda.graph` (vLLM's default: pieces compiled per size,
each size captured). On the emulated device inductor writes cpu code whose fused kernels are no
torch calls, so the piece must run as one device op for a capture to record it and for the stream
tracking to order it."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class _FusedOnly(torch.nn.Module):
    """Pointwise ops only: inductor fuses them into one kernel, with no aten call left."""

    def forward(self, x, y):
        return torch.relu(x * 2 + y) - 1


class _SplitQKV(torch.nn.Module):
    """A norm and a projection split three ways (views of one buffer), beside a fresh output."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.RMSNorm(16)
        self.qkv = torch.nn.Linear(16, 48, bias=False)

    def forward(self, h):
        q, k, v = self.qkv(self.norm(h)).split(16, dim=-1)
        return q, k, v, torch.empty_like(q), h * 2


def _compile_fx(module: torch.nn.Module, inputs: list):
    # imported where a runtime imports it (vLLM: inside its compiler adaptor), after entering
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(torch.fx.symbolic_trace(module), inputs)


def _tracking_on() -> None:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_a_piece_of_fused_kernels_returns_one_tensor_and_replays_them(cuda_kind):
    torch.manual_seed(0)
    _tracking_on()
    x, y = torch.randn(4, 8, device="cuda"), torch.randn(4, 8, device="cuda")
    with torch.no_grad():
        piece = _compile_fx(_FusedOnly(), [x, y])
        out = piece(x, y)  # eager, with the stream tracking on
        assert isinstance(out, torch.Tensor) and out.shape == (4, 8) and out.is_cuda
        torch.testing.assert_close(out, torch.relu(x * 2 + y) - 1)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = piece(x, y)
        x.fill_(1.0)
        y.fill_(0.5)
        graph.replay()
        torch.cuda.synchronize()
    torch.testing.assert_close(captured.cpu(), torch.full((4, 8), 1.5))


def test_a_piece_returning_views_of_one_buffer_runs_and_replays(cuda_kind):
    torch.manual_seed(0)
    _tracking_on()
    module = _SplitQKV().to("cuda")
    h = torch.randn(4, 16, device="cuda")
    with torch.no_grad():
        piece = _compile_fx(module, [h])
        expected = module(h)
        got = piece(h)
        for a, b in zip(got[:3] + got[4:], expected[:3] + expected[4:]):
            torch.testing.assert_close(a, b)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = piece(h)
        h.copy_(torch.randn(4, 16, device="cuda"))
        expected = module(h)
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(captured[:3] + captured[4:], expected[:3] + expected[4:]):
            torch.testing.assert_close(a, b)
