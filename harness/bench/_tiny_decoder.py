"""A hand-written Llama-shaped decode step over a static KV cache: every shape fixed, every buffer
preallocated, so one step captures into a graph. The emulator benchmark and the graphs suite's
equivalence check run it; it is not the reference model (harness.model)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TinyDecoderConfig:
    layers: int = 4
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    vocab: int = 512
    max_seq: int = 64
    batch: int = 4
    dtype: torch.dtype = torch.bfloat16

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + eps)).to(x.dtype) * weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class TinyDecoder:
    """Weights, the KV cache and the step's input buffers (`tokens`, `positions`), all static."""

    def __init__(self, config: TinyDecoderConfig, *, seed: int = 0,
                 device: torch.device | str = "cpu") -> None:
        self.config = c = config
        gen = torch.Generator().manual_seed(seed)

        def weight(*shape: int) -> torch.Tensor:
            w = torch.randn(*shape, generator=gen) / shape[0] ** 0.5
            return w.to(device=device, dtype=c.dtype)

        self.embed = weight(c.vocab, c.hidden)
        self.layers = [
            {"attn_norm": torch.ones(c.hidden, dtype=c.dtype, device=device),
             "wqkv": weight(c.hidden, (c.heads + 2 * c.kv_heads) * c.head_dim),
             "wo": weight(c.heads * c.head_dim, c.hidden),
             "mlp_norm": torch.ones(c.hidden, dtype=c.dtype, device=device),
             "wgate_up": weight(c.hidden, 2 * c.intermediate),
             "wdown": weight(c.intermediate, c.hidden)}
            for _ in range(c.layers)]
        self.final_norm = torch.ones(c.hidden, dtype=c.dtype, device=device)
        self.lm_head = weight(c.hidden, c.vocab)
        cache_shape = (c.layers, 2, c.batch, c.max_seq, c.kv_heads, c.head_dim)
        self.kv_cache = torch.zeros(cache_shape, dtype=c.dtype, device=device)
        inv_freq = 1.0 / 10000 ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim)
        angles = torch.outer(torch.arange(c.max_seq, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.cos = angles.cos().to(device=device, dtype=c.dtype)
        self.sin = angles.sin().to(device=device, dtype=c.dtype)
        self.rows = torch.arange(c.batch, device=device)
        self.key_positions = torch.arange(c.max_seq, device=device)
        self.tokens = torch.zeros(c.batch, dtype=torch.long, device=device)
        self.positions = torch.zeros(c.batch, dtype=torch.long, device=device)

    def _per_query_head(self, cache: torch.Tensor) -> torch.Tensor:
        """[batch, seq, kv_heads, dim] -> [batch, heads, seq, dim], each kv head shared by a group."""
        c = self.config
        group = c.heads // c.kv_heads
        expanded = cache.transpose(1, 2)[:, :, None].expand(c.batch, c.kv_heads, group, c.max_seq, c.head_dim)
        return expanded.reshape(c.batch, c.heads, c.max_seq, c.head_dim)

    def step(self) -> torch.Tensor:
        """Logits [batch, vocab] for `tokens` at `positions`; writes this step's K and V."""
        c = self.config
        h = torch.nn.functional.embedding(self.tokens, self.embed)
        cos = self.cos.index_select(0, self.positions)[:, None, :]
        sin = self.sin.index_select(0, self.positions)[:, None, :]
        future = self.key_positions[None, :] > self.positions[:, None]
        mask = torch.zeros(c.batch, 1, 1, c.max_seq, dtype=c.dtype, device=h.device)
        mask.masked_fill_(future[:, None, None, :], float("-inf"))
        for i, layer in enumerate(self.layers):
            x = _rms_norm(h, layer["attn_norm"])
            q, k, v = (x @ layer["wqkv"]).split(
                [c.heads * c.head_dim, c.kv_heads * c.head_dim, c.kv_heads * c.head_dim], dim=-1)
            q = _rotate(q.view(c.batch, c.heads, c.head_dim), cos, sin)
            k = _rotate(k.view(c.batch, c.kv_heads, c.head_dim), cos, sin)
            self.kv_cache[i, 0].index_put_((self.rows, self.positions), k)
            self.kv_cache[i, 1].index_put_((self.rows, self.positions), v.view(c.batch, c.kv_heads, c.head_dim))
            keys, values = (self._per_query_head(self.kv_cache[i, j]) for j in (0, 1))
            scores = (q[:, :, None, :] @ keys.transpose(-1, -2)) * c.head_dim ** -0.5 + mask
            attn = torch.softmax(scores.float(), dim=-1).to(c.dtype) @ values
            h = h + attn.reshape(c.batch, c.heads * c.head_dim) @ layer["wo"]
            gate, up = (_rms_norm(h, layer["mlp_norm"]) @ layer["wgate_up"]).chunk(2, dim=-1)
            h = h + (torch.nn.functional.silu(gate) * up) @ layer["wdown"]
        return _rms_norm(h, self.final_norm) @ self.lm_head
