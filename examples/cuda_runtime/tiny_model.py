"""A tiny paged-KV decoder in plain torch, written for CUDA the way nano-vllm's model is: it reads
the step's attention metadata (slot_mapping, context_lens, block_tables) from a context set by the
runner, writes each token's K/V into its slot (slot -1, a padding row, writes to a sink slot that no
sequence reads), and attends over each sequence's blocks. Every shape depends only on the batch
size, so one decode step captures into a CUDA graph."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TinyConfig:
    vocab: int = 256
    hidden: int = 64
    heads: int = 4
    layers: int = 2
    block_size: int = 4
    num_blocks: int = 128
    max_blocks_per_seq: int = 8

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass
class Context:
    """The attention metadata of one step (nano-vllm's `set_context`)."""

    slot_mapping: torch.Tensor   # [bs] int32, -1 for padding rows
    context_lens: torch.Tensor   # [bs] int32, tokens each sequence attends to (this one included)
    block_tables: torch.Tensor   # [bs, max_blocks_per_seq] int32


class TinyDecoder(torch.nn.Module):
    def __init__(self, config: TinyConfig, seed: int = 0) -> None:
        super().__init__()
        self.config = c = config
        gen = torch.Generator().manual_seed(seed)

        def weight(*shape):
            # drawn on the host (a cpu generator cannot drive CUDA's kernels), then moved with the module
            return torch.nn.Parameter(torch.randn(*shape, generator=gen, device="cpu") / shape[-1] ** 0.5,
                                      requires_grad=False)

        self.embed = weight(c.vocab, c.hidden)
        self.qkv = torch.nn.ParameterList(weight(3 * c.hidden, c.hidden) for _ in range(c.layers))
        self.out = torch.nn.ParameterList(weight(c.hidden, c.hidden) for _ in range(c.layers))
        self.lm_head = weight(c.vocab, c.hidden)
        slots = c.num_blocks * c.block_size + 1  # the last slot is the padding rows' sink
        self.register_buffer("k_cache", torch.zeros(c.layers, slots, c.heads, c.head_dim))
        self.register_buffer("v_cache", torch.zeros(c.layers, slots, c.heads, c.head_dim))
        self.context: Context | None = None
        # Scratch for the attention scores, grown on demand (the hazard a runner must size before
        # capture: a graph keeps the buffer it was captured with).
        self.workspace = torch.empty(0)

    def reserve_workspace(self, batch: int) -> None:
        """Grow the scores workspace to hold a step of `batch` sequences."""
        c = self.config
        need = batch * c.heads * c.max_blocks_per_seq * c.block_size
        if self.workspace.numel() < need:
            self.workspace = torch.empty(need, device=self.k_cache.device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        c, ctx = self.config, self.context
        bs = input_ids.size(0)
        sink = self.k_cache.size(1) - 1
        slots = torch.where(ctx.slot_mapping < 0, sink, ctx.slot_mapping).long()
        # Each sequence's keys: its blocks' slots, [bs, max_blocks * block_size].
        offsets = torch.arange(c.block_size, device=input_ids.device)
        key_slots = (ctx.block_tables.long()[:, :, None] * c.block_size + offsets).flatten(1)
        visible = torch.arange(key_slots.size(1), device=input_ids.device)[None, :] < ctx.context_lens[:, None]
        x = self.embed[input_ids]
        angle = positions[:, None].float() / (10000 ** (torch.arange(c.head_dim // 2, device=x.device) / (c.head_dim // 2)))
        cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
        for layer in range(c.layers):
            q, k, v = (x @ self.qkv[layer].t()).view(bs, 3, c.heads, c.head_dim).unbind(1)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            self.k_cache[layer].index_copy_(0, slots, k)
            self.v_cache[layer].index_copy_(0, slots, v)
            keys, values = self.k_cache[layer][key_slots], self.v_cache[layer][key_slots]
            self.reserve_workspace(bs)
            scores = self.workspace[:bs * c.heads * keys.size(1)].view(bs, c.heads, 1, keys.size(1))
            torch.matmul(q[:, :, None, :], keys.permute(0, 2, 3, 1), out=scores)
            scores = scores.squeeze(2) / c.head_dim ** 0.5
            scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
            attended = torch.einsum("bhl,blhd->bhd", scores.softmax(-1), values)
            x = x + attended.reshape(bs, c.hidden) @ self.out[layer].t()
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.lm_head.t()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
