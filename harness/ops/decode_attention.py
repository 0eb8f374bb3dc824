"""`harness::paged_decode_attention`: paged attention for decode-only batches, reading K/V straight
from the cache (no per-layer gather of every token's context) where the tensors are on CUDA.

Same arguments and effects as `harness::paged_attention` without the scratch and the context plan,
which only the gather needs: k/v are written into the cache at slot_mapping, then `out` gets each
token's attention over what its sequence shows it; k = v = None means the cache already holds
them (`harness::rope_kv_write` wrote it). The implementations:

- CUDA: the cache write in torch ops (none when k = v = None), then the Triton kernel (`triton_decode.py`), imported on the
  first CUDA call so that installs without triton never import it.
- every other device (the CPU; the emulated CUDA device, whose device tensors are CPU tensors): the
  torch-ops path of `harness::paged_attention` (`paged_attention_impl`), the kernel's reference.
- fake: nothing to compute (it returns nothing and mutates what it was given).

`pdl` (last, default False): the Triton launches use Programmatic Dependent Launch
(`pdl_choice.py`); the torch path ignores it. (With k and v given, the torch cache write before
the kernel is an ordinary kernel, so the kernel's wait orders it.)

The kernel is right for any batch (each token row attends causally within its own sequence); it is
only fast where one query token per sequence reads a long context, so `paged_attention()` picks it
for decode-only batches (`decode_kernel.py` says when).
"""

from __future__ import annotations

from typing import Optional

import torch

from harness.ops.paged_context import paged_attention_impl, write_kv


def _torch_ops(q: torch.Tensor, k: Optional[torch.Tensor], v: Optional[torch.Tensor],
               kv_layer: torch.Tensor,
               slot_mapping: torch.Tensor, positions: torch.Tensor, token_to_seq: torch.Tensor,
               seq_lens: torch.Tensor, block_tables: torch.Tensor, scale: float,
               out: torch.Tensor, pdl: bool = False) -> None:
    paged_attention_impl(q, k, v, kv_layer, slot_mapping, positions, token_to_seq, seq_lens,
                         block_tables, scale, out, None)


paged_decode_attention_op = torch.library.custom_op(
    "harness::paged_decode_attention", mutates_args=("kv_layer", "out"))(_torch_ops)


@paged_decode_attention_op.register_kernel("cuda")
def _(q, k, v, kv_layer, slot_mapping, positions, token_to_seq, seq_lens, block_tables, scale,
      out, pdl=False) -> None:
    from harness.ops.triton_decode import paged_decode_triton

    if k is not None and v is not None:
        write_kv(kv_layer, k, v, slot_mapping)
    paged_decode_triton(q, kv_layer, positions, token_to_seq, seq_lens, block_tables, scale, out,
                        pdl=pdl)


@paged_decode_attention_op.register_fake
def _(q, k, v, kv_layer, slot_mapping, positions, token_to_seq, seq_lens, block_tables, scale,
      out, pdl=False) -> None:
    return None
