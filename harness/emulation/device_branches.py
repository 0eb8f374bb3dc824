"""Python functions of torch that choose a branch by their input's device.

`F.interpolate` (bilinear and trilinear), `F.pad` (replicate) and `F.max_pool3d` take another path
on CUDA under `torch.use_deterministic_algorithms(True)`: a decomposition whose backward
accumulates with `index_put` (deterministic), instead of the kernel whose backward alerts
("upsample_bilinear2d_backward_out_cuda does not have a deterministic implementation"). They ask
`input.is_cpu` or `input.is_cuda` in their Python body. The placement mode answers those reads as
CUDA would, but a torch-function mode is off while it runs the call it was handed, so the body read
the cpu tensor's own answer and took the CPU's branch: a deterministic training step that runs on
a GPU raised on the emulated device at its backward.

While such a call runs, its tensor input is seen through a subclass that reads as a CUDA tensor
(`is_cpu` False, `is_cuda` True) and has no torch-function override of its own, so the body takes
CUDA's branch with torch's own conditions, whichever torch is installed, and its ops run as any
other device call. The subclass shares the input's memory and autograd history (`as_subclass`), and
only the reads of the body see it: what the body returns is made by its ops."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.torch_internals import disabled_torch_function_impl

# The functions whose body reads `is_cpu`/`is_cuda` to choose CUDA's branch, each named as
# `handle_torch_function` hands it to a mode (F.max_pool3d's `return_indices=False` form calls
# `max_pool3d_with_indices`'s body only through the aten op, so it needs no entry).
CALLS = tuple(f for f in (F.interpolate, F.pad, getattr(F, "max_pool3d_with_indices", None))
              if f is not None)


class _ReadsAsDevice(Tensor):
    """A device tensor as a torch function's Python body sees it on CUDA."""

    __torch_function__ = disabled_torch_function_impl

    @property
    def is_cpu(self) -> bool:  # type: ignore[override]
        return False

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def seen_as_device(args: tuple) -> tuple:
    """`args` with its first tensor (the input these functions branch on) seen as CUDA's."""
    if args and isinstance(args[0], Tensor) and type(args[0]) is Tensor:
        return (args[0].as_subclass(_ReadsAsDevice),) + tuple(args[1:])
    return args


__all__ = ["CALLS", "seen_as_device"]
