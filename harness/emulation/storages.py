"""A device tensor's storage as CUDA's: it says it is on the device (`storage.device`,
`is_cuda`, and so `Tensor.is_shared()`, True for every CUDA tensor, and `share_memory_()`, a no-op
for one), and `torch.UntypedStorage(n, device="cuda")` makes device memory. Sharing device memory
with another process (CUDA IPC, what torch.multiprocessing does with a CUDA tensor) is refused by
name: the emulated device lives in one process.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from harness import torch_internals
from harness.emulation import device_indices
from harness.emulation.device_indices import storage_index
from harness.emulation.device_memory import is_device_memory
from harness.emulation.rules import cuda_index, names_cuda


def storage_device(state) -> property:
    """`UntypedStorage.device`: cuda:i for device memory, torch's own answer otherwise."""
    base = inspect.getattr_static(torch.UntypedStorage, "device")

    def device(storage: torch.UntypedStorage) -> torch.device:
        if is_device_memory(storage):
            return torch.device("cuda", storage_index(storage))
        return base.__get__(storage, type(storage))

    return property(device)


def storage_is_shared(state):
    """`UntypedStorage.is_shared()`: True for device memory, as for every CUDA storage (its C
    implementation asks the storage's own, cpu, device)."""
    base = torch.UntypedStorage.is_shared

    def is_shared(storage: torch.UntypedStorage) -> bool:
        return True if is_device_memory(storage) else base(storage)

    return is_shared


def storage_resize(state):
    """`UntypedStorage.resize_()` of device memory: CUDA copies the old bytes into the new block on
    the current stream, after the work queued there (Resize.cpp, a cudaMemcpyAsync), and frees the
    old block. The host swaps the memory at once here, so the current stream's queued work (a
    replay held back by the adversarial schedule) runs first, as on CUDA it reads the old block
    before the copy; the host waits for nothing more."""
    base = torch.UntypedStorage.resize_

    def resize_(storage: torch.UntypedStorage, size: int):
        if is_device_memory(storage):
            state.notify_stream("storage_resize", state.streams.current(), None)
        return base(storage, size)

    return resize_


def storage_new(state) -> staticmethod:
    """`torch.UntypedStorage(...)`: with a cuda device, the device memory of a byte tensor made
    there (its size, or the bytes of a sequence); anything else as torch makes it."""
    base = torch.UntypedStorage.__new__

    def new(cls, *args, device: Any = None, **kwargs):
        if device is None or not names_cuda(device) or cls is not torch.UntypedStorage:
            if device is not None:
                kwargs["device"] = device
            return base(cls, *args, **kwargs)
        if kwargs or len(args) > 1:
            raise TypeError(f"torch.UntypedStorage(...) on the emulated CUDA device takes a size "
                            f"or a sequence of bytes and device=; got {len(args)} positional "
                            f"arguments and {sorted(kwargs)}")
        source = args[0] if args else 0
        index = cuda_index(device, state.current_index, state.properties.count)
        if isinstance(source, int):
            state.check_capacity(source, index)
            made = torch.empty(source, dtype=torch.uint8)
        else:
            made = torch.tensor(list(source), dtype=torch.uint8)
        # Made on the host and marked, not through a "cuda" factory: torch's own storage code
        # (a storage's clone(), so copy.deepcopy of a device tensor) calls this from inside the
        # placement mode's handling of a call, where no factory is rewritten to the device.
        state.memory.mark_device(made)
        device_indices.set_index(made, index)
        return made.untyped_storage()

    return staticmethod(new)


def storage_from_data_pointer(state):
    """`torch._C._construct_storage_from_data_pointer(ptr, device, nbytes)`: a storage over bytes
    it does not own, what cudagraph trees and runtimes' weak references to graph outputs are made
    of (vLLM keeps its captured outputs so). For a cuda device, the host bytes at `ptr` marked as
    device memory; a CPU build would make a storage that says cuda and that no device op takes."""
    base = torch_internals.construct_storage_from_data_pointer

    def construct(data_ptr: int, device: Any, nbytes: int) -> torch.UntypedStorage:
        if not names_cuda(device):
            return base(data_ptr, device, nbytes)
        index = cuda_index(device, state.current_index, state.properties.count)
        storage = base(data_ptr, torch.device("cpu"), nbytes)
        state.memory.mark_alias(storage)
        device_indices.set_storage_index(storage, index)
        return storage

    return construct


def share_cuda_refused(state):
    def _share_cuda_(storage, *args, **kwargs):
        raise NotImplementedError(
            "sharing device memory with another process (CUDA IPC: torch.multiprocessing with a "
            "CUDA tensor, UntypedStorage._share_cuda_) is not supported on the emulated CUDA "
            "device: it lives in one process. Send host tensors between processes instead.")

    return _share_cuda_
