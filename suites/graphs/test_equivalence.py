"""Replay equals eager, bit for bit, on small multi-op bf16 functions (the emulator's replay calls
the same kernels through out= overloads, fills and copies)."""

from __future__ import annotations

import torch

from harness.bench._tiny_decoder import TinyDecoder, TinyDecoderConfig


def _mlp(device):
    gen = torch.Generator().manual_seed(0)
    w1 = torch.randn(16, 32, generator=gen).to(device, torch.bfloat16)
    w2 = torch.randn(32, 16, generator=gen).to(device, torch.bfloat16)
    norm = torch.rand(16, generator=gen).to(device, torch.bfloat16)

    def fn(x):
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16) * norm
        return x + torch.nn.functional.silu(h @ w1) @ w2

    return fn


def _attention(device):
    gen = torch.Generator().manual_seed(1)
    wqkv = torch.randn(16, 48, generator=gen).to(device, torch.bfloat16) / 4

    def fn(x):
        q, k, v = (x @ wqkv).view(x.shape[0], 3, 2, 8).unbind(1)
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        scores = torch.softmax((q @ k.transpose(-1, -2)).float() / 8 ** 0.5, dim=-1)
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = (scores.to(torch.bfloat16) @ v + sdpa).transpose(0, 1).reshape(x.shape[0], 16)
        return out, torch.topk(out.float(), 3, dim=-1).indices

    return fn


def _check_matches_eager(backend, block, *, inference: bool) -> None:
    static_x = torch.zeros(5, 16, device=backend.device, dtype=torch.bfloat16)
    with torch.inference_mode(inference), torch.no_grad():
        graph = backend.capture(lambda: block(static_x))
    for seed in (2, 3):
        x = torch.randn(5, 16, generator=torch.Generator().manual_seed(seed)).to(static_x)
        static_x.copy_(x)
        graph.replay()
        backend.synchronize()
        with torch.no_grad():
            expected = block(x)
        for got, want in zip(_as_tuple(graph.output), _as_tuple(expected), strict=True):
            _assert_matches(backend, got, want)


def _as_tuple(output):
    return output if isinstance(output, tuple) else (output,)


def _assert_matches(backend, got: torch.Tensor, want: torch.Tensor) -> None:
    if backend.name == "emulated":
        assert torch.equal(got, want)
    else:  # CUDA may pick other kernels inside a graph; agree within bf16 rounding
        torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)


def test_mlp_block_matches_eager(backend):
    _check_matches_eager(backend, _mlp(backend.device), inference=False)


def test_attention_block_matches_eager_in_inference_mode(backend):
    _check_matches_eager(backend, _attention(backend.device), inference=True)


def test_tiny_decoder_steps_match_eager(backend):
    config = TinyDecoderConfig(layers=2, batch=2, max_seq=8)
    graphed, eager = (TinyDecoder(config, device=backend.device) for _ in range(2))
    with torch.inference_mode():
        graph = backend.capture(graphed.step)
        for position in range(3):
            for decoder in (graphed, eager):
                decoder.tokens.copy_(torch.tensor([5, 9]) * (position + 1))
                decoder.positions.fill_(position)
            graph.replay()
            backend.synchronize()
            expected = eager.step()
            _assert_matches(backend, graph.output, expected)
        _assert_matches(backend, graphed.kv_cache, eager.kv_cache)
