"""A user's TorchDispatchMode sees the emulated device's tensors as CUDA shows them.

The device's tensors are cpu tensors; the placement mode (a TorchFunctionMode) answers `x.device`,
`x.is_cuda` and the rest for them. But it answers only while it is on the function-mode stack,
and torch pops a mode while the mode handles a call: the aten ops of a device call reach the
dispatch modes below it with no placement mode to ask, so a user's `__torch_dispatch__` saw
cpu tensors, a factory's `device=cpu` and unmarked results, and a mode that acts on CUDA
tensors only (torch 2.14's `check_input_liveness=True` tracker, FLOP counters or memory
trackers keyed on the device) did nothing.

While the emulation is in force, a user's dispatch mode pushed onto torch's stack (any mode
but torch's infrastructure modes, FakeTensorMode and the like, and the device's own) has its
`__torch_dispatch__` run under `DeviceView`, a function mode that

- answers every torch call but an operator through the placement mode: the questions a tensor
  answers (`device`, `is_cuda`, `get_device()`, `is_pinned()`, ...) as CUDA would, and the
  mode's own torch calls as device calls;
- presents an operator of a device call as CUDA's dispatcher hands it on: a `device=cpu` the
  placement mode wrote for cuda names `cuda:N` again;
- runs the operator the mode hands on (`func(*args, **kwargs)`) with cuda named as the cpu again,
  and marks its new results device memory when the call is on the device (but those CUDA makes
  on the host, host_outputs.py), so that the mode sees them on the device (the placement mode
  marks only the call's final result, after the dispatch modes have returned).

A mode entered before `emulate_cuda()`, or one entered by `torch._C._push_on_torch_dispatch_stack`
directly, is not wrapped (docs/fidelity.md).
"""

from __future__ import annotations

import contextlib
import types
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from harness import torch_internals
from harness.emulation import device_indices, host_outputs
from harness.emulation.active import is_in_force
from harness.emulation.device_memory import is_device_memory, own_storage
from harness.emulation.rules import CPU, names_cuda
from harness.emulation.user_mode_stack import is_users_mode

Tensor = torch.Tensor
# The wrapper set on a mode's instance while it is on the stack, by the wrapped method it replaces
_WRAPPED = "_harness_device_view"
_OPERATORS = (torch_internals.OpOverload, torch_internals.HigherOrderOperator)


def patches(state) -> list[tuple[Any, str, Any]]:
    """`_push_mode`/`_pop_mode` of torch.utils._python_dispatch, which TorchDispatchMode's
    `__enter__`/`__exit__` (and `_disable_current_modes`) call: a user's mode is wrapped while it
    is on the stack, and while `_pop_mode_temporarily` takes it off for one call."""
    module = torch_internals.torch_namespace("torch.utils._python_dispatch")
    push, pop = torch_internals.push_mode, torch_internals.pop_mode

    def push_mode(mode) -> None:
        if is_users_mode(mode) and _WRAPPED not in vars(mode):
            bound = mode.__torch_dispatch__
            setattr(mode, _WRAPPED, bound)
            mode.__torch_dispatch__ = types.MethodType(_viewed(state, bound), mode)
        push(mode)

    def pop_mode(*args, **kwargs):
        mode = pop(*args, **kwargs)
        if _WRAPPED in getattr(mode, "__dict__", ()):
            del mode.__torch_dispatch__
            delattr(mode, _WRAPPED)
        return mode

    @contextlib.contextmanager
    def pop_mode_temporarily(*args, **kwargs):
        # How torch's Python dispatcher hands a higher-order operator (torch.cond, while_loop)
        # to the mode on top: popped for the call, pushed back after. The mode keeps its wrapper
        # meanwhile, so its __torch_dispatch__ sees the device there too.
        mode = pop(*args, **kwargs)
        try:
            yield mode
        finally:
            push(mode)

    return [(module, "_push_mode", push_mode), (module, "_pop_mode", pop_mode),
            (module, "_pop_mode_temporarily", pop_mode_temporarily)]


def _viewed(state, handler: Callable) -> Callable:
    """The mode's `__torch_dispatch__` (`handler`, bound) run under DeviceView while the
    emulation `state` is in force."""
    memory = state.memory

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        if not is_in_force(state) or _placement_on_stack(state.placement):
            return handler(func, types_, args, kwargs)
        kwargs = kwargs or {}
        if memory.call_on_device and isinstance(func, torch_internals.OpOverload) \
                and not memory.makes_host_memory(func):
            device = kwargs.get("device")
            if isinstance(device, torch.device) and device.type == "cpu":
                kwargs = {**kwargs, "device": state.device_object(_index(state))}
        with DeviceView(state):
            return handler(func, types_, args, kwargs)

    return __torch_dispatch__


def _placement_on_stack(placement) -> bool:
    """Whether the placement mode answers already: it is on the function-mode stack (not popped
    while it handles the call this op belongs to)."""
    return any(torch_internals.get_function_stack_at(i) is placement
               for i in range(torch_internals.len_torch_function_stack()))


def _index(state) -> int:
    # the placement mode makes the call's device current while the call runs
    return state.current_index if state.properties.count > 1 else 0


class DeviceView(TorchFunctionMode):
    """What a user's `__torch_dispatch__` runs under (module docstring)."""

    def __init__(self, state) -> None:
        super().__init__()
        self.state = state

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not isinstance(func, _OPERATORS):
            return self.state.placement.__torch_function__(func, types_, args, kwargs)
        named = False
        if any(_names_cuda(a) for a in args):
            args, named = tuple(CPU if _names_cuda(a) else a for a in args), True
        if _names_cuda(kwargs.get("device")):
            kwargs, named = {**kwargs, "device": CPU}, True
        out = func(*args, **kwargs)
        memory = self.state.memory
        if named or memory.call_on_device and not memory.makes_host_memory(func):
            inputs = _storages((args, kwargs))  # kept alive while their ids are compared
            ids = {id(s) for s in inputs}
            for t in _tensors(host_outputs.device_outputs(out, host_outputs.of_op(func))):
                # the device's memory is the cpu's (a meta tensor's shape inference is no memory)
                storage = own_storage(t) if t.device.type == "cpu" else None
                if storage is not None and id(storage) not in ids \
                        and not is_device_memory(storage):
                    memory.mark_device(t)
                    index = _index(self.state)
                    if index:
                        device_indices.set_index(t, index)
        return out


def _names_cuda(a) -> bool:
    return isinstance(a, (str, torch.device)) and names_cuda(a)


def _tensors(tree) -> list[Tensor]:
    return [t for t in torch_internals.tree_flatten(tree)[0] if isinstance(t, Tensor)]


def _storages(tree) -> list:
    return [s for s in map(own_storage, _tensors(tree)) if s is not None]
