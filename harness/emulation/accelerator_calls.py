"""The device-generic calls of `torch.accelerator` and `torch.get_device_module` that the stream
and memory rows of cuda_api.py leave out, answered as a CUDA build answers them.

A CUDA build's accelerator is cuda wherever `torch._C._get_accelerator()` is asked; a CPU build
(and a CUDA build without a GPU) answers cpu, so runtimes that pick their device module with
`torch.get_device_module()` got `torch.cpu`, FSDP found no accelerator and fully_shard's default
mesh was a cpu one. Both calls answer cuda inside the emulation. One caller keeps the build's
answer: the distributed package's barrier (`the_builds_accelerator`, distributed.py) turns it
into the device of a tensor it allocates in C++, which a CPU build cannot make for cuda; the
emulated device's collectives are gloo's over host memory, and its barrier runs there.
`get_device_module` also caches its answers: one computed before the emulation began (or inside
it) would outlive it, so its cache is emptied on entry and on exit.

CUDA registers no graph implementation for `torch.accelerator.Graph` (only XPU's is built: the
CUDA wheels of 2.14.1 hold no graph implementation), so constructing one raises "Graph is not
supported on device type: cuda" on CUDA, where the CPU build raised "Cannot access accelerator
device when none is available."; CUDA's device guard leaves `getDeviceCapability` to the base
class, whose answer is "Backend doesn't support getting device capabilities.".

`torch.accelerator`'s calls that take a device read it as torch's Python half does
(`torch.accelerator._utils._get_device_index`) before CUDA sees the index: a device of another
type is "cpu doesn't match the current accelerator cuda." (a ValueError), a device without an
index is the current one, or, for `set_device_index`, refused; the index then goes to the
device's own call, which refuses an ordinal the device lacks.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any, Callable

import torch

from harness import torch_internals

GRAPH_REFUSAL = "Graph is not supported on device type: cuda"
CAPABILITY_REFUSAL = "Backend doesn't support getting device capabilities."


def accelerator_index(device: Any, optional: bool = True) -> int | None:
    """The device index torch's Python half reads from `device` (an int, a name, a
    torch.device), the accelerator being cuda; None for the current device where `optional`."""
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    index = None
    if isinstance(device, torch.device):
        if device.type != "cuda":
            raise ValueError(f"{device.type} doesn't match the current accelerator cuda.")
        index = device.index
    if index is None and not optional:
        raise ValueError(f"Expected a torch.device with a specified index or an integer, but "
                         f"got:{device}")
    return index


def taking_a_device(call: Callable, *, optional: bool = True) -> Callable:
    """`call(state, device, ...)`, a device call of cuda_api.py, as the `torch.accelerator`
    function of that name: its device read as torch's Python half reads it first."""

    @functools.wraps(call)
    def accelerator_call(state, device: Any = None, *args: Any, **kwargs: Any) -> Any:
        return call(state, accelerator_index(device, optional), *args, **kwargs)

    return accelerator_call


# Set while a caller that must get the build's own accelerator runs (the distributed barrier).
_BUILDS_OWN: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "harness_the_builds_accelerator", default=False)


def accelerator_of_the_build(state) -> Callable[[], torch.device]:
    """What `torch._C._get_accelerator` is inside the emulation: cuda (a torch.device without
    an index, as CUDA's build answers), but inside `the_builds_accelerator()`."""
    original = torch_internals.get_accelerator
    cuda = torch.device("cuda")

    def _get_accelerator() -> torch.device:
        return original() if _BUILDS_OWN.get() else cuda

    _get_accelerator.__doc__ = original.__doc__
    return _get_accelerator


@contextlib.contextmanager
def the_builds_accelerator():
    """`torch._C._get_accelerator()` answers as this build does for the code run inside."""
    token = _BUILDS_OWN.set(True)
    try:
        yield
    finally:
        _BUILDS_OWN.reset(token)


def device_module_class(state) -> Any:
    """What `torch.get_device_module` is inside the emulation: `torch.cuda` for no device (the
    current accelerator's module on a CUDA build), torch's answer for a named one."""
    original = torch.get_device_module

    def get_device_module(device: Any = None) -> Any:
        if device is None:
            return torch.cuda
        return original(device)

    get_device_module.__doc__ = original.__doc__
    # dynamo looks torch's function up by identity (its rule for it folds the module in as a
    # constant, calling this at trace time); this attribute is how it finds the function a
    # wrapper stands for
    get_device_module._torchdynamo_inline = original
    # and its rule is registered for the function torch's cache wraps, wherever it is first built
    get_device_module.__wrapped__ = original.__wrapped__
    return get_device_module


def device_capability_refused(state, device: Any = None) -> None:
    """`torch.accelerator.get_device_capability`: CUDA's guard has no answer (see above), for
    any device (the base class does not look at it)."""
    raise RuntimeError(CAPABILITY_REFUSAL)


def graph_class(state, original: type) -> type:
    """What `torch.accelerator.Graph` is inside the emulation: torch's class, refused at
    construction as CUDA refuses it."""

    class Graph(original):
        __doc__ = original.__doc__

        def __new__(cls, *args: Any, **kwargs: Any):
            raise RuntimeError(GRAPH_REFUSAL)

    Graph.__module__ = original.__module__
    return Graph


def patches(state) -> list[tuple[Any, str, Any]]:
    """(owner, name, replacement) for `torch.accelerator.Graph` where this torch has it (2.13 on),
    in the package and in the module that defines it."""
    graphs = getattr(torch.accelerator, "graphs", None)
    original = getattr(graphs, "Graph", None)
    if original is None:
        return []
    refused = graph_class(state, original)
    return [(owner, "Graph", refused) for owner in (torch.accelerator, graphs)
            if vars(owner).get("Graph") is original]


@contextlib.contextmanager
def fresh_device_modules():
    """`torch.get_device_module`'s cached answers forgotten on entry and on exit."""
    forget = getattr(torch.get_device_module, "cache_clear", None)
    if forget is None:
        yield
        return
    forget()
    try:
        yield
    finally:
        forget()


__all__ = ["CAPABILITY_REFUSAL", "GRAPH_REFUSAL", "accelerator_index", "accelerator_of_the_build",
           "device_module_class", "device_capability_refused", "fresh_device_modules",
           "graph_class", "patches", "taking_a_device", "the_builds_accelerator"]
