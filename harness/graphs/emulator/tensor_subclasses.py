"""Users' tensor subclasses (torchao's quantized weights, DTensor, a wrapper with a
`__torch_dispatch__` of its own) under the emulator's dispatch modes.

A dispatch mode runs before any subclass's `__torch_dispatch__`; a mode that does not know a
subclass returns NotImplemented, the subclass's `__torch_dispatch__` then runs with the mode still
on the stack, and the ops it calls on the tensors it wraps come back to the mode as plain tensors
(FakeTensorMode and torch's own modes do the same). The emulator's modes read storages and data
pointers, which a wrapper subclass has none of (its storage is a placeholder that refuses
`data_ptr()`): they defer to the subclass and see the work it does on the tensors it holds, as a
CUDA kernel sees only those. torch's own tracing subclasses (FakeTensor, FunctionalTensor) are
not deferred to: the modes already know them.
"""

from __future__ import annotations

from typing import Any

import torch

_TORCH_TRACING = "torch._subclasses."


def _own_dispatch(cls: type) -> Any:
    dispatch = getattr(cls, "__torch_dispatch__", None)
    return getattr(dispatch, "__func__", dispatch)


_PLAIN = _own_dispatch(torch.Tensor)  # torch.Tensor's own: dispatch disabled


def is_users_subclass(cls: type) -> bool:
    """Whether `cls`, a type a dispatch mode is handed, is a tensor subclass with a
    `__torch_dispatch__` of its own that is not one of torch's tracing subclasses (a mode may be
    handed torch.Tensor itself)."""
    return (isinstance(cls, type) and issubclass(cls, torch.Tensor)
            and not cls.__module__.startswith(_TORCH_TRACING) and _own_dispatch(cls) is not _PLAIN)


def defer_to_subclass(types: Any) -> bool:
    """Whether a dispatch mode should return NotImplemented for an op whose arguments include
    these `types` (empty for plain tensors and parameters: the hot path asks nothing more)."""
    return bool(types) and any(is_users_subclass(t) for t in types)
