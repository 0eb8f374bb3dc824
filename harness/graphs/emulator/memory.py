"""Which memory a tensor lives in, as a capture must know it: device memory (what a graph records)
or host memory (work on it runs once, when capture meets it; copies from it must be pinned).

Three answers, one per way the emulator runs:

- `AllDevice`: the plain emulator on a cpu device (`get_backend("emulated")`). Host and device are
  one memory, so every tensor counts as device memory; host tensors made during capture are told
  apart by how they were made (`host_tensors.py`), a guess kept for code adapted to run on "cpu".
- `ByDeviceType`: real accelerator tensors (the emulator on a cuda device, the graph sanitizer):
  device memory is what `tensor.device` says.
- The emulated CUDA device's registry (`device/memory.py`): CPU tensors, device or host by the
  storage they live on, exactly as CUDA would place them.
"""

from __future__ import annotations

import torch


class AllDevice:
    """Every tensor is device memory (the cpu device of the plain emulator)."""

    all_device = True

    def is_device(self, t: torch.Tensor) -> bool:
        return True

    def is_pinned(self, t: torch.Tensor) -> bool:
        return t.is_pinned()

    def call_targets_device(self) -> bool:
        return True

    def mark_device(self, t: torch.Tensor) -> None:
        pass


class ByDeviceType:
    """Device memory is what `tensor.device` says: tensors on `device.type` (a real cuda device)."""

    all_device = False

    def __init__(self, device: torch.device) -> None:
        self.device_type = device.type

    def is_device(self, t: torch.Tensor) -> bool:
        return t.device.type == self.device_type

    def is_pinned(self, t: torch.Tensor) -> bool:
        return t.is_pinned()

    def call_targets_device(self) -> bool | None:
        return None  # a factory names its device itself; the recorder reads it from the call

    def mark_device(self, t: torch.Tensor) -> None:
        pass


def for_device(device: torch.device):
    """The answer for the plain emulator on `device`: AllDevice on cpu, else ByDeviceType."""
    return AllDevice() if device.type == "cpu" else ByDeviceType(device)
