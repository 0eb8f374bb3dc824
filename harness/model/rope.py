"""Rotary position embeddings as transformers computes them for a Llama config.

The inverse frequencies come from transformers' own RoPE initialisers (`rope_parameters` in 5.x,
`rope_theta` / `rope_scaling` before), so llama3-style scaling is read from the config, not assumed.
cos and sin are tabulated per position once: a lookup by the metadata's positions is a device gather,
which a graph can replay, and yields the same values transformers computes on the fly. (-sin is
exact, so the signed table holds transformers' values too.)
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig

# Types whose frequencies depend on the current sequence length cannot be tabulated once.
_DYNAMIC_ROPE_TYPES = ("dynamic", "longrope")


def rope_parameters(config: LlamaConfig) -> dict:
    """The RoPE parameters of `config`, in the transformers 5.x shape (rope_type, rope_theta, ...)."""
    params = getattr(config, "rope_parameters", None)
    if params is None:  # transformers 4.x keeps them in rope_theta and rope_scaling
        params = {"rope_type": "default", "rope_theta": config.rope_theta, **(config.rope_scaling or {})}
        params["rope_type"] = params.pop("type", params["rope_type"])
    return dict(params)


def inverse_frequencies(config: LlamaConfig) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim / 2] in fp32, attention scaling) exactly as transformers' Llama uses them."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rope_type = rope_parameters(config).get("rope_type", "default")
    if rope_type in _DYNAMIC_ROPE_TYPES:
        raise ValueError(f"rope_type {rope_type!r} rescales with sequence length; supported are fixed "
                         f"frequency types (default, linear, llama3, yarn, ...), not {_DYNAMIC_ROPE_TYPES}")
    with torch.device("cpu"):
        rotary = LlamaRotaryEmbedding(config=config)
    return rotary.inv_freq.float(), float(rotary.attention_scaling)


class RotaryTable(nn.Module):
    """cos and signed sin for every position up to `max_positions`, in the model dtype, stacked in
    one table so that a batch's rows are one gather.

    The signed sin is (-sin, sin) over the two halves of a head: rotate_half(x) * sin equals
    roll(x, half) * signed_sin, which `harness.ops.rotary.apply_rotary_` uses to rotate in
    three kernels."""

    def __init__(self, config: LlamaConfig, dtype: torch.dtype) -> None:
        super().__init__()
        inv_freq, scaling = inverse_frequencies(config)  # on the CPU
        positions = torch.arange(config.max_position_embeddings, dtype=torch.float32, device="cpu")
        freqs = positions[:, None] * inv_freq[None, :]
        # Rounded to the model dtype after scaling, as transformers does; built on the CPU and moved
        # to the default device, so a model built under `with torch.device(...)` gets it there.
        cos = (freqs.cos() * scaling).to(dtype)
        sin = (freqs.sin() * scaling).to(dtype)
        table = torch.stack((torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)), dim=1)
        device = torch.empty(0).device
        self.register_buffer("table", table.to(device), persistent=False)  # [positions, 2, head_dim]

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin of shape [tokens, 1, head_dim], broadcasting over heads."""
        rows = self.table.index_select(0, positions)
        return rows[:, 0:1], rows[:, 1:2]
