"""Rotary position embedding applied with torch ops, from rows of a (cos, signed sin) table.

The table is `harness.model.rope.RotaryTable`'s: cos and the signed sin (-sin, sin) over the two
halves of a head, so rotate_half(x) * sin is roll(x, half) * signed_sin. It lives here, below the
model, because the fused rope + KV-write op (`rope_kv_write.py`) is the other user of the rule.
"""

from __future__ import annotations

import torch


def apply_rotary_(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [tokens, heads, head_dim] in place, in its own dtype: x * cos + rotate_half(x) * sin,
    with x * cos rounded first as transformers rounds it."""
    rolled = x.roll(x.shape[-1] // 2, dims=-1)  # (x2, x1): rotate_half(x) up to the sign in signed_sin
    return x.mul_(cos).addcmul_(rolled, signed_sin)


def rotated(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """What `apply_rotary_` makes of x, in a new tensor (x is left as it was)."""
    return apply_rotary_(x.clone(), cos, signed_sin)
