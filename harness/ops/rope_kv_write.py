"""`harness::rope_kv_write`: rotary embedding of a layer's q and k and the write of k and v into
the paged KV cache, as one op (vLLM's rotary_embedding + reshape_and_cache), so the attention op
after it finds the cache already written (it is called with k = v = None).

q [T, H, D] is rotated in place; k [T, KVH, D] is rotated into the cache, itself unchanged; v is
written as it is; cos and the signed sin [T, 1, D] are `RotaryTable` rows for the tokens'
positions. The implementations:

- CUDA: one Triton kernel (`triton_rope_kv.py`), imported on the first CUDA call so that installs
  without triton never import it.
- every other device (the CPU; the emulated CUDA device, whose device tensors are CPU tensors): the
  torch ops of the unfused path (`rotary.apply_rotary_`, `attention.write_kv`), the kernel's
  reference.
- fake: nothing to compute (it returns nothing and mutates what it was given), so dynamo and
  inductor trace it and a dispatcher-level recording sizes nothing for it.

Every shape comes from the tensors and no device value is read on the host, so the op can be
captured. `rope_kv_choice.py` says when an engine uses it.
"""

from __future__ import annotations

import torch

from harness.ops.attention import write_kv
from harness.ops.rotary import apply_rotary_, rotated


def _torch_ops(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor, kv_layer: torch.Tensor, slot_mapping: torch.Tensor,
               pdl: bool = False) -> None:
    apply_rotary_(q, cos, sin)
    write_kv(kv_layer, rotated(k, cos, sin), v, slot_mapping)


rope_kv_write_op = torch.library.custom_op(
    "harness::rope_kv_write", mutates_args=("q", "kv_layer"))(_torch_ops)


@rope_kv_write_op.register_kernel("cuda")
def _(q, k, v, cos, sin, kv_layer, slot_mapping, pdl=False) -> None:
    from harness.ops.triton_rope_kv import rope_kv_write_triton

    rope_kv_write_triton(q, k, v, cos, sin, kv_layer, slot_mapping, pdl=pdl)


@rope_kv_write_op.register_fake
def _(q, k, v, cos, sin, kv_layer, slot_mapping, pdl=False) -> None:
    return None


def check_rope_kv_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, kv_layer: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Host-side shape checks (shapes only: capture-safe); the op itself trusts its caller."""
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"q must be [tokens, heads, head_dim] and k, v [tokens, kv_heads, head_dim], "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    tokens, _, head_dim = q.shape
    if k.shape[0] != tokens or k.shape[2] != head_dim or head_dim % 2:
        raise ValueError(f"k {tuple(k.shape)} must have q's {tokens} tokens and its even head_dim "
                         f"{head_dim}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape != (tokens, 1, head_dim):
            raise ValueError(f"{name} {tuple(t.shape)} must be [{tokens}, 1, {head_dim}] (RotaryTable rows)")
    if tuple(kv_layer.shape[3:]) != (k.shape[1], head_dim) or kv_layer.dim() != 5:
        raise ValueError(f"kv_layer {tuple(kv_layer.shape)} must be [2, blocks, block_size, "
                         f"{k.shape[1]}, {head_dim}]")
    if slot_mapping.shape != (tokens,):
        raise ValueError(f"slot_mapping {tuple(slot_mapping.shape)} must be [{tokens}]")
    if q.dtype != kv_layer.dtype or k.dtype != kv_layer.dtype or v.dtype != kv_layer.dtype:
        raise ValueError(f"q/k/v dtype {q.dtype}/{k.dtype}/{v.dtype} must match the cache dtype "
                         f"{kv_layer.dtype}")


def rope_kv_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, kv_layer: torch.Tensor, slot_mapping: torch.Tensor,
                  pdl: bool = False) -> torch.Tensor:
    """Checked call of `harness::rope_kv_write`; returns q (rotated). `pdl`: its CUDA kernel is
    launched with Programmatic Dependent Launch (pdl_choice.py; the torch path ignores it)."""
    check_rope_kv_inputs(q, k, v, cos, sin, kv_layer, slot_mapping)
    rope_kv_write_op(q, k, v, cos, sin, kv_layer, slot_mapping, pdl)
    return q
