"""A compiled graph's aten ops meet CUDA's kernels, not only the CPU's.

A compiled graph runs with the placement mode off the stack (compiled_graphs.py), so its aten ops
(aot_eager's graphs, inductor's fallbacks) reach the CPU's kernels without the placement mode's
corrections: a half or bfloat16 kernel the CPU lacks raised "not implemented for 'Half'" where CUDA
has it (reduced_kernels.py), and an op only the CPU has (missing_kernels.py) computed where CUDA's
dispatcher refuses it, and an integer division by zero raised the CPU's "ZeroDivisionError" where
CUDA's kernels divide unchecked (kernels.py). While such a graph runs on device memory,
`DeviceKernels` gives its aten ops the placement mode's answers for all three (and for
kernels.py's other kernels CUDA answers apart: `histc` of integers, `one_hot`, `lstsq`). Inductor's own C++
code checks its integer divisions itself, past any dispatcher: that stays the CPU's."""

from __future__ import annotations

import operator

import torch

from harness.emulation import kernels, missing_kernels, reduced_kernels
from harness.emulation.device_memory import is_device_memory
from harness.graphs.emulator.dispatch_keys import keep_modes_reachable
from harness.graphs.emulator.tensor_subclasses import defer_to_subclass
from harness.torch_internals import TorchDispatchMode, tree_flatten

_WIDENED = reduced_kernels.WIDENED
_CPU_ONLY = missing_kernels.CPU_ONLY
_REPLACED = kernels.ATEN_REPLACEMENTS
# What a graph dynamo traces calls for an integer division (its operators, torch's functions)
_TRACED_DIVISIONS = frozenset({operator.floordiv, operator.mod, operator.ifloordiv, operator.imod,
                               torch.floor_divide, torch.remainder, torch.fmod, torch.div,
                               torch.divide})
# Torch functions of kernels.py's other replacements a graph may call (not `mm`: its replaced
# form, `out_dtype=`, is rare, and every matmul graph would pay for the mode)
_TRACED_KERNELS = frozenset({torch.histc, torch.Tensor.histc, torch.nn.functional.one_hot,
                             torch.linalg.lstsq})


def in_graph(graph_module: torch.fx.GraphModule) -> bool:
    """Whether a compiled graph calls a kernel whose CPU and CUDA forms differ (a torch function
    or its aten op)."""
    for node in graph_module.graph.nodes:
        target = (getattr(torch.Tensor, node.target, None) if node.op == "call_method"
                  else node.target if node.op == "call_function" else None)
        if target is None:
            continue
        if target in _WIDENED or target in _CPU_ONLY or target in _REPLACED \
                or target in _TRACED_DIVISIONS or target in _TRACED_KERNELS \
                or target in kernels.INTEGER_DIVISION_CALLS:
            return True
    return False


def _on_device(args: tuple, kwargs: dict) -> bool:
    return any(isinstance(a, torch.Tensor) and is_device_memory(a)
               for a in tree_flatten((args, kwargs))[0])


class DeviceKernels(TorchDispatchMode):
    """For a compiled graph's eager run on device memory: its aten ops of a reduced kernel the CPU
    lacks run widened, those CUDA has no kernel for are refused in CUDA's words, and integer
    divisions (and kernels.py's other replaced kernels) answer as CUDA's kernels do."""

    def __enter__(self):
        out = super().__enter__()
        keep_modes_reachable()
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if types and defer_to_subclass(types):
            return NotImplemented  # the subclass's own dispatch first (tensor_subclasses.py)
        kwargs = kwargs or {}
        if func in _CPU_ONLY and _on_device(args, kwargs) \
                and missing_kernels.refused(func, args, kwargs):
            raise missing_kernels.no_cuda_kernel(func, args, kwargs)
        if func in _REPLACED and _on_device(args, kwargs):
            return _REPLACED[func](*args, **kwargs)
        if func in _WIDENED and reduced_kernels.needs_widening(func, args, kwargs):
            return reduced_kernels.widened(func)(*args, **kwargs)
        return func(*args, **kwargs)


__all__ = ["DeviceKernels", "in_graph"]
