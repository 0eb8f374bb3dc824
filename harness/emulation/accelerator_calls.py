"""The device-generic calls of `torch.accelerator` and `torch.get_device_module` that the stream
and memory rows of cuda_api.py leave out, answered as a CUDA build answers them.

A CUDA build's accelerator is cuda wherever `torch._C._get_accelerator()` is asked (torch's
`get_device_module()` without a device, the distributed package's default backend and barrier
device, FSDP's default device); a CPU build answers cpu, so runtimes that pick their device module
that way got `torch.cpu`. `get_device_module` also caches its answers: one computed before the
emulation began (or inside it) would outlive it, so its cache is emptied on entry and on exit.

CUDA registers no graph implementation for `torch.accelerator.Graph` (only XPU's is built: the
CUDA wheels of 2.14.1 hold no graph implementation), so constructing one raises "Graph is not
supported on device type: cuda" on CUDA, where the CPU build raised "Cannot access accelerator
device when none is available."; CUDA's device guard leaves `getDeviceCapability` to the base
class, whose answer is "Backend doesn't support getting device capabilities.".
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

GRAPH_REFUSAL = "Graph is not supported on device type: cuda"
CAPABILITY_REFUSAL = "Backend doesn't support getting device capabilities."


def current_accelerator_device(state, check: bool = False) -> torch.device:
    """`torch._C._get_accelerator`: the device type a CUDA build reports."""
    return torch.device("cuda")


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


__all__ = ["CAPABILITY_REFUSAL", "GRAPH_REFUSAL", "current_accelerator_device",
           "device_capability_refused", "fresh_device_modules", "graph_class", "patches"]
