"""Autograd's products on the emulated device. The autograd engine makes gradients in C++, where
no TorchFunctionMode sees them; while `backward()` or `autograd.grad()` runs, a light dispatch
mode marks each fresh result device memory when one of the op's inputs is."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from harness.graphs.emulator.device.memory import DEVICE, MEMORY_ATTR


def _is_device(t) -> bool:
    try:
        return getattr(t.untyped_storage(), MEMORY_ATTR, None) == DEVICE
    except (RuntimeError, NotImplementedError):
        return False


class _MarkResults(TorchDispatchMode):
    def __init__(self, memory) -> None:
        super().__init__()
        self.memory = memory

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = tree_flatten((args, kwargs))[0]
        if any(isinstance(t, torch.Tensor) and _is_device(t) for t in inputs):
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.memory.mark_device(t)
        return out


def run_backward(memory, func, args: tuple, kwargs: dict):
    """`func(*args, **kwargs)` (Tensor.backward, autograd.backward or autograd.grad) with its
    results marked; autograd.grad's returned gradients follow their inputs."""
    with _MarkResults(memory):
        out = func(*args, **kwargs)
    if func is torch.autograd.grad:
        inputs = kwargs.get("inputs", args[1] if len(args) > 1 else ())
        inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
        for grad, inp in zip(out, inputs):
            if grad is not None and _is_device(inp):
                memory.mark_device(grad)
    return out
