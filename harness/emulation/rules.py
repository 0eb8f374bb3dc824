"""CUDA's words for what the emulated device refuses, and how a device argument is read."""

from __future__ import annotations

from typing import Any

import torch

from harness.graphs.base import CaptureError
from harness.graphs.emulator.callsite import at_callsite, current_callsite

CPU = torch.device("cpu")

PAGEABLE_COPY_TEXT = ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless "
                      "the CPU tensor is pinned")


class DeviceIndexError(RuntimeError):
    """A device index the emulated device does not have (CUDA: "invalid device ordinal")."""


def cuda_device(index: int) -> torch.device:
    return torch.device("cuda", index)


def names_cuda(device: Any) -> bool:
    """Whether a device argument names cuda: "cuda", "cuda:1", torch.device("cuda"), or an int
    (PyTorch reads a bare index as a cuda device)."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device == "cuda" or device.startswith("cuda:")
    return isinstance(device, int) and not isinstance(device, bool)


def cuda_index(device: Any, current: int, count: int) -> int:
    """The cuda device index a device argument names (None index: the current device); an index the
    emulated device lacks raises CUDA's error."""
    if isinstance(device, int):
        index = device
    else:
        index = torch.device(device).index
        index = current if index is None else index
    if not 0 <= index < count:
        raise DeviceIndexError(f"CUDA error: invalid device ordinal (device index {index}; the "
                               f"emulated device has {count} device(s), indices 0 to {count - 1})")
    return index


def mixed_devices_error(first: str, second: str) -> RuntimeError:
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                        f"devices, {first} and {second}!")


def host_generator_error() -> RuntimeError:
    """CUDA's refusal of a cpu `torch.Generator` for a random op on the device."""
    return RuntimeError("Expected a 'cuda' device type for generator but found 'cpu'")


def device_generator_on_host_error() -> RuntimeError:
    """CUDA's refusal of a cuda `torch.Generator` for a random op on the host."""
    return RuntimeError("Expected a 'cpu' device type for generator but found 'cuda'")


def numpy_of_device_error(index: int) -> TypeError:
    return TypeError(f"can't convert cuda:{index} device type tensor to numpy. Use Tensor.cpu() to "
                     f"copy the tensor to host memory first.")


def pageable_copy_refused(op: str, shape: tuple) -> CaptureError:
    return CaptureError(at_callsite(
        f"{op} copies a pageable host tensor of shape {shape} to the device during capture: "
        f"{PAGEABLE_COPY_TEXT}. Copy into a static device buffer before capture, or copy from a "
        f"pinned host buffer (`pin_memory()`), which the graph re-reads at every replay",
        current_callsite()), op=op)


def host_copy_refused(op: str, shape: tuple) -> CaptureError:
    return CaptureError(at_callsite(
        f"{op} copies a device tensor of shape {shape} to the host during capture: a copy to the "
        f"host waits for the device (a sync), which a capturing stream refuses (\"operation not "
        f"permitted when stream is capturing\"); read results after replay()",
        current_callsite()), op=op)
