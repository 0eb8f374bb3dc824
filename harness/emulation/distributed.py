"""`torch.distributed` on the emulated CUDA device: NCCL refused by name, gloo for cuda tensors.

Multi-rank runtimes pick NCCL for cuda tensors (`init_process_group("nccl")`, or `device_id=` a
cuda device, which torch's default map turns into NCCL). NCCL's collectives are kernels on GPUs,
and the emulated device's tensors are host memory: on the CPU wheel torch refused with "Distributed
package doesn't have NCCL built in", on a CUDA wheel without a GPU the first collective failed on
tensors NCCL saw as cpu ones, neither naming the emulation. Inside it a backend naming NCCL is
refused with `UnsupportedOnEmulatedDevice` and the remedy; gloo takes the emulated device's
tensors, collectives inside a capture included, and is the default backend for cuda tensors while
the emulation lasts: `init_process_group()` without a backend is gloo's (a CUDA build would derive
one from its accelerator and leave the device's cpu tensors without a backend), and
`init_process_group(device_id=<a cuda device>)` leaves the binding out (its barrier would allocate
on a cuda device in C++).
"""

from __future__ import annotations

from typing import Any

import torch

from harness.emulation.accelerator_calls import the_builds_accelerator
from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice


def _refuse_nccl(call: str, backend: Any) -> None:
    if backend is not None and "nccl" in str(backend).lower():
        raise UnsupportedOnEmulatedDevice(
            f"{call}(backend={str(backend)!r}) inside harness.emulate_cuda(): NCCL's collectives "
            f"run as kernels on GPUs, and the emulated CUDA device's tensors are host memory. Use "
            f"backend='gloo' (it takes the emulated device's tensors, in a capture too) or leave "
            f"the backend out, which gives gloo for cuda tensors while the emulation lasts")


def _backend_argument(args: tuple, kwargs: dict, position: int) -> Any:
    return kwargs["backend"] if "backend" in kwargs else (
        args[position] if len(args) > position else None)


def patches(state) -> list[tuple[Any, str, Any]]:
    """(owner, name, replacement) for torch.distributed, where this torch build has it."""
    if not torch.distributed.is_available():
        return []
    import torch.distributed.distributed_c10d as c10d

    init, new = c10d.init_process_group, c10d.new_group

    def init_process_group(*args, **kwargs):
        backend = _backend_argument(args, kwargs, 0)
        _refuse_nccl("torch.distributed.init_process_group", backend)
        if backend is None:
            # torch derives a missing backend from the accelerator a CUDA build reports, and gives
            # the group no backend for the cpu tensors the emulated device's really are; gloo
            # names one for each device type
            kwargs = {**kwargs, "backend": "gloo"}
            args = args[1:]
        device_id = kwargs.get("device_id")
        if device_id is not None and (isinstance(device_id, int)
                                      or torch.device(device_id).type == "cuda"):
            # Binding a gloo group to a cuda device makes its barrier allocate on the device in
            # C++, which a CPU build cannot; gloo runs the emulated device's host memory anyway.
            kwargs = {k: v for k, v in kwargs.items() if k != "device_id"}
        return init(*args, **kwargs)

    def new_group(*args, **kwargs):
        _refuse_nccl("torch.distributed.new_group", _backend_argument(args, kwargs, 2))
        return new(*args, **kwargs)

    barrier = c10d.barrier

    def barrier_on_the_host(*args, **kwargs):
        # torch's barrier allocates a tensor in C++ on the device `torch._C._get_accelerator()`
        # names (and on the index of `device_ids=`), which a CPU build cannot make for cuda: it
        # gets the build's own accelerator, and gloo's barrier runs over host memory
        with the_builds_accelerator():
            return barrier(*args, **kwargs)

    for replacement, original in ((init_process_group, init), (new_group, new),
                                  (barrier_on_the_host, barrier)):
        replacement.__wrapped__ = original
        replacement.__doc__ = original.__doc__
    defaults = {**c10d.Backend.default_device_backend_map, "cuda": "gloo"}
    return [(module, name, value) for module in (torch.distributed, c10d)
            for name, value in (("init_process_group", init_process_group),
                                ("new_group", new_group), ("barrier", barrier_on_the_host))] \
        + [(c10d.Backend, "default_device_backend_map", defaults)]


__all__ = ["patches"]
