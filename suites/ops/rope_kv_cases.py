"""Inputs for the rope + KV-write tests: q, k and v as views of one projection's output (as the
model hands them over), cos and signed sin as rows of a real `RotaryTable`, a paged cache of random
values with scattered slots, and padded rows that all write the pad sink; the float64 reference and
the unfused torch path the op must reproduce."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LlamaConfig

from harness.model.rope import RotaryTable
from harness.ops import PagedKVCache
from harness.ops.attention import write_kv
from harness.ops.rope_kv_write import rope_kv_write_op
from harness.ops.rotary import apply_rotary_


@dataclass
class RopeKvCase:
    qkv: torch.Tensor  # [tokens, heads + 2 * kv_heads, head_dim]: q, k, v are views of it
    heads: int
    kv_heads: int
    cos: torch.Tensor
    sin: torch.Tensor
    cache: PagedKVCache
    slot_mapping: torch.Tensor
    num_real: int  # the rows after these are padding, writing the pad sink

    @property
    def q(self) -> torch.Tensor:
        return self.qkv[:, : self.heads]

    @property
    def k(self) -> torch.Tensor:
        return self.qkv[:, self.heads: self.heads + self.kv_heads]

    @property
    def v(self) -> torch.Tensor:
        return self.qkv[:, self.heads + self.kv_heads:]

    def args(self) -> tuple[torch.Tensor, ...]:
        """The op's arguments: q, k, v, cos, sin, kv_layer, slot_mapping."""
        return self.q, self.k, self.v, self.cos, self.sin, self.cache.layer(0), self.slot_mapping


def rope_kv_case(*, tokens: int = 5, pad_rows: int = 1, heads: int = 4, kv_heads: int = 2,
                 head_dim: int = 16, block_size: int = 4, num_blocks: int = 6,
                 dtype: torch.dtype = torch.bfloat16, seed: int = 0, device="cpu") -> RopeKvCase:
    gen = torch.Generator().manual_seed(seed)
    config = LlamaConfig(hidden_size=heads * head_dim, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, head_dim=head_dim, max_position_embeddings=256)
    with torch.device("cpu"):
        table = RotaryTable(config, dtype).table
    total = tokens + pad_rows
    positions = torch.randint(0, 256, (total,), generator=gen)
    positions[tokens:] = 0  # padded rows sit at position 0, as the metadata pads them
    rows = table.index_select(0, positions).to(device)
    cache = PagedKVCache(1, num_blocks, block_size, kv_heads, head_dim, dtype, device)
    cache.tensor.copy_(torch.randn(cache.tensor.shape, generator=gen))
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slot_mapping = torch.cat((slots, torch.full((pad_rows,), cache.pad_slot))).to(device)
    qkv = (torch.randn(total, heads + 2 * kv_heads, head_dim, generator=gen) * 3).to(dtype).to(device)
    return RopeKvCase(qkv, heads, kv_heads, rows[:, 0:1], rows[:, 1:2], cache, slot_mapping, tokens)


def separate_path(case: RopeKvCase) -> tuple[torch.Tensor, torch.Tensor]:
    """(rotated q, the layer's cache) as the unfused model path makes them: q and k rotated together
    in place by apply_rotary_, then the attention op's write_kv; on copies."""
    qkv = case.qkv.clone()
    layer = case.cache.layer(0).clone()
    h, kvh = case.heads, case.kv_heads
    apply_rotary_(qkv[:, : h + kvh], case.cos, case.sin)
    write_kv(layer, qkv[:, h: h + kvh], qkv[:, h + kvh:], case.slot_mapping)
    return qkv[:, :h], layer


def float64_rotation(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin in float64, from the table's (signed) values."""
    x, cos, sin = x.double().cpu(), cos.double().cpu(), sin.double().cpu()
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


def bf16_steps(dtype: torch.dtype, magnitude: float, steps: int) -> float:
    return steps * torch.finfo(dtype).eps * max(magnitude, 1.0)


def replay_on_a_later_case(first: RopeKvCase, later: RopeKvCase) -> None:
    """Capture the op on `first` (after one launch outside capture, as a runtime warms up), copy
    `later`'s values into the captured inputs and the cache, and replay: `first` then holds what
    the op makes of `later`."""
    args = first.args()
    rope_kv_write_op(*args)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rope_kv_write_op(*args)
    first.qkv.copy_(later.qkv), first.cos.copy_(later.cos), first.sin.copy_(later.sin)
    first.cache.tensor.copy_(later.cache.tensor), first.slot_mapping.copy_(later.slot_mapping)
    graph.replay()
    torch.cuda.synchronize()
