"""`torch.load` of tensors saved on, or mapped to, "cuda": restored into the emulated device's
memory.

torch.load restores each storage through `torch.serialization.default_restore_location(storage,
location)` (looked up at call time, for every `map_location` form); CUDA's deserializer copies the
storage to the GPU named by the location. On a build or machine without CUDA that raises, so
inside the emulation a location naming cuda gives a copy of the storage marked device memory
(after the device's capacity check, as a GPU allocation would run out of memory); every other
location goes to torch's own restore. The copy lands on the device the location names ("cuda:1"
with `device_count=2`; "cuda" is the current device), as CUDA's does. Saving tags each storage with
`torch.serialization.location_tag(storage)`: a storage of device memory is tagged with its device
("cuda:0", "cuda:1"), as CUDA tags a GPU storage, so a checkpoint saved from the device loads back
onto the same device.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from harness.emulation.device_indices import set_storage_index, storage_index
from harness.emulation.device_memory import is_device_memory
from harness.emulation.rules import cuda_index, names_cuda


def restore_location(state, original: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    """A replacement for `torch.serialization.default_restore_location`."""

    def restore(storage: Any, location: str):
        if not (isinstance(location, str) and names_cuda(location)):
            return original(storage, location)
        count = state.properties.count
        index = torch.device(location).index
        if index is not None and index >= count:
            # torch.serialization's _validate_device, before CUDA is asked for the device
            raise RuntimeError(
                f"Attempting to deserialize object on CUDA device {index} but "
                f"torch.cuda.device_count() is {count}. Please use torch.load with map_location "
                "to map your storages to an existing device.")
        index = cuda_index(location, state.current_index, count)
        # torch.load hands every storage over untyped (the zip and the legacy format alike)
        state.check_capacity(storage.nbytes(), index)
        restored = storage.clone()
        state.memory.adopt(restored)
        set_storage_index(restored, index)
        return restored

    return restore


def location_tag(state, original: Callable[[Any], str]) -> Callable[[Any], str]:
    """A replacement for `torch.serialization.location_tag`."""

    def tag(storage: Any) -> str:
        untyped = storage.untyped() if isinstance(storage, torch.TypedStorage) else storage
        if isinstance(untyped, torch.UntypedStorage) and is_device_memory(untyped):
            return str(state.device_object(storage_index(untyped)))
        return original(storage)

    return tag
