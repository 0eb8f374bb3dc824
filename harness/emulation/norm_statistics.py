"""The statistics CUDA's batch and layer norm kernels return, in float32 for half and bfloat16 input.

CUDA's `batch_norm_cuda` (aten/src/ATen/native/cuda/Normalization.cu, what `native_batch_norm`,
`_native_batch_norm_legit` and `_batch_norm_with_update` run) and `layer_norm_cuda`
(layer_norm_kernel.cu) make their saved mean and inverse standard deviation in the input's
accumulate type, float32 for float16 and bfloat16 input; the CPU's kernels make them in the input's
dtype. The emulated device gives a device call's statistics back in float32, so code that reads
them (a fused backward, a dtype check) sees what a GPU gives."""

from __future__ import annotations

from typing import Callable

import torch

from harness import torch_internals

_REDUCED = (torch.float16, torch.bfloat16)
_aten = torch.ops.aten

# The calls: torch's, and torch.ops.aten's overloads and packets. Each returns its statistics
# (saved mean, inverse standard deviation) second and third.
CALLS = frozenset({
    torch.native_batch_norm, torch_internals.native_batch_norm_legit,
    torch_internals.native_batch_norm_legit_no_training, torch.native_layer_norm,
    _aten.native_batch_norm.default, _aten._native_batch_norm_legit.default,
    _aten._native_batch_norm_legit.no_stats, _aten._native_batch_norm_legit_no_training.default,
    _aten._batch_norm_with_update.default, _aten.native_layer_norm.default,
    _aten.native_batch_norm, _aten._native_batch_norm_legit,
    _aten._native_batch_norm_legit_no_training, _aten._batch_norm_with_update,
    _aten.native_layer_norm,
})
_STATISTICS = (1, 2)


def in_float32(x, out, cast: Callable[[torch.Tensor, torch.dtype], torch.Tensor]):
    """`out`, the outputs of one of CALLS for the device input `x`, with its statistics in float32
    where `x` is of a reduced dtype. `cast` is the device's own cast (a device op)."""
    if not (isinstance(x, torch.Tensor) and x.dtype in _REDUCED and isinstance(out, tuple)):
        return out
    return tuple(cast(o, torch.float32) if i in _STATISTICS and isinstance(o, torch.Tensor)
                 and o.dtype in _REDUCED else o for i, o in enumerate(out))


__all__ = ["CALLS", "in_float32"]
