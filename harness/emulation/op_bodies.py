"""Python bodies of users' custom ops see the emulated CUDA device, as eager code does.

A `torch.library.custom_op` (or a `Library.impl` of a Python function) is called through the
dispatcher; its body runs inside the call the placement mode handles, where torch has popped the
mode off the function-mode stack, and inside a compiled graph, which runs with the mode off the
stack (compiled_graphs.py). Without the mode the body's tensors are the cpu tensors under the
device's: `pic.device` says cpu, `pic.cpu()` is the same memory, and `.cuda()` or a factory naming
cuda reaches torch's own CUDA runtime ("Found no NVIDIA driver"; on a CPU wheel "not linked with
support for cuda"). On CUDA the body is eager code on the device like any other.

So each Python kernel registered for a user's op while the emulation lasts (custom_ops.py patches
`Library.impl`) runs with the placement mode pushed back for its body. Inside a compiled graph the
body's tensor arguments are the graph's intermediate buffers, cpu memory inductor allocated; where
the graph works on device memory only (its Placement names no host tensor), they are device memory
on CUDA, and are marked so before the body reads them.

A `torch.library.custom_op` defined before the emulation entered gets the same for its device
kernels while the emulation lasts (`wrap_registered`: torch looks them up in the op's table at
each call). Left as they were: other Python kernels registered before the emulation entered
(torch keeps them in C++) and such an op's meta kernel; torch's and the harness's namespaces;
autograd kernels (they call the others).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

import torch

from harness import torch_internals

# torch's own and the harness's: their ops' CPU paths are deliberate, or they are torch's kernels
_LEFT_ALONE = frozenset({"aten", "prim", "prims", "c10d", "inductor", "quantized", "harness",
                         "harness_compiled"})

# Dispatch keys whose kernel is eager code on the tensors: a device's backend, the composite
# kernel custom_op registers for every device (device_types=None), and the meta kernel
# `register_fake` registers, which runs for real meta tensors (a fake tensor run calls the fake
# kernel itself, and is left alone below).
_BODY_KEYS = frozenset({"CPU", "CUDA", "CompositeExplicitAutograd", "CompositeImplicitAutograd",
                        "Meta"})


def user_namespace(namespace: str) -> bool:
    """Whether ops of `namespace` are a user's (not torch's nor the harness's own)."""
    return namespace not in _LEFT_ALONE and not namespace.startswith("_")


def wrapped(state, namespace: str, dispatch_key: str, fn: Any) -> Any:
    """`fn`, a Python kernel registered for `namespace`'s op at `dispatch_key`, as the emulated
    device runs it: with the placement mode on the stack for its body."""
    if not callable(fn) or dispatch_key not in _BODY_KEYS or not user_namespace(namespace):
        return fn

    @functools.wraps(fn)
    def body(*args, **kwargs):
        with _placement_on_stack(state, args, kwargs):
            return fn(*args, **kwargs)

    return body


def wrap_registered(state) -> Callable[[], None]:
    """Wrap the device kernels of every user's `custom_op` defined before now; returns what puts
    them back (the emulation's exit)."""
    custom_ops = torch_internals.lazy_module("library_custom_ops")
    wrapped_now: list[tuple[dict, Any, Any, Any]] = []
    for qualname, opdef in list(custom_ops.OPDEFS.items()):
        if not user_namespace(qualname.partition("::")[0]):
            continue
        table = opdef._backend_fns
        for device_type, fn in list(table.items()):
            body = wrapped(state, qualname.partition("::")[0], _key_of(device_type), fn)
            if body is not fn:
                table[device_type] = body
                wrapped_now.append((table, device_type, fn, body))

    def restore() -> None:
        for table, device_type, fn, body in wrapped_now:
            if table.get(device_type) is body:  # not registered again meanwhile
                table[device_type] = fn

    return restore


def _key_of(device_type) -> str:
    """The dispatch key custom_op registers a device type's kernel at."""
    return "CompositeExplicitAutograd" if device_type is None else device_type.upper()


@contextlib.contextmanager
def _placement_on_stack(state, args, kwargs):
    from harness.emulation.active import is_in_force

    placement = state.placement
    if (placement is None or not is_in_force(state) or torch.compiler.is_compiling()
            or placement in torch_internals.get_current_function_mode_stack()
            or any(torch_internals.is_fake_tensor(t) for t in _tensors(args, kwargs))):
        yield
        return
    memory = state.memory
    if memory.compiled_on_device:
        _mark_device(state, args, kwargs)
    # The body is eager code: the placement mode decides its calls' memory, not the graph's flags.
    flags = memory.call_on_device, memory.compiled_on_device
    memory.call_on_device = memory.compiled_on_device = False
    # The device's own machinery runs an op's kernel with torch function off (stream tracking's
    # dispatch, a replay); the body is the user's code, and sees the device all the same.
    enabled = (contextlib.nullcontext() if torch_internals.is_torch_function_enabled()
               else torch_internals.EnableTorchFunction())
    torch_internals.push_on_torch_function_stack(placement)
    try:
        with enabled:
            yield
    finally:
        _pop(placement)
        memory.call_on_device, memory.compiled_on_device = flags


def _mark_device(state, args, kwargs) -> None:
    """A compiled graph's buffers handed to the body: device memory, as CUDA allocates them."""
    from harness.emulation.device_memory import is_device_memory

    for t in _tensors(args, kwargs):
        if t.device.type == "cpu" and t.layout == torch.strided and not is_device_memory(t):
            state.memory.mark_device(t)


def _tensors(args, kwargs):
    for value in (*args, *kwargs.values()):
        for t in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(t, torch.Tensor):
                yield t


def _pop(placement) -> None:
    """Take the mode pushed for the body off again, keeping what the body left above it."""
    from harness.emulation.backward import remove_function_mode

    remove_function_mode(placement)


__all__ = ["user_namespace", "wrap_registered", "wrapped"]
