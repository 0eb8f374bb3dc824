"""`torch.Generator(device="cuda")` on the emulated device.

Device tensors are cpu tensors, so a device generator is a cpu generator that says it belongs to
the device (`device` is `cuda:N`) and that the placement mode accepts for random ops on the
device, where it refuses a plain cpu generator as CUDA does. `torch.Generator` is replaced by a
class whose instances are torch's own generators (`isinstance(g, torch.Generator)` holds for every
generator, as outside the emulation); only its construction looks at the device. What differs
from CUDA: the numbers drawn are the cpu kernels' (Philox on CUDA), and `get_state()` is the cpu
generator's state (5056 bytes; CUDA's is 16: seed and offset).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from harness import torch_internals

_TorchGenerator = torch_internals.Generator


class DeviceGenerator(_TorchGenerator):
    """A generator of the emulated device `index`."""

    def __new__(cls, index: int):
        return super().__new__(cls, device="cpu")

    def __init__(self, index: int) -> None:
        self.index = index

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.index)

    def __repr__(self) -> str:
        return f"<torch.Generator object on cuda:{self.index} (emulated)>"

    def graphsafe_get_state(self) -> "DeviceGenerator":
        """CUDA hands out the generator's state object itself, shared; a cpu generator's state
        cannot be shared, so this is a generator holding a copy of it (docs/fidelity.md)."""
        out = DeviceGenerator(self.index)
        out.set_state(self.get_state())
        return out

    def graphsafe_set_state(self, state: _TorchGenerator) -> None:
        """Draw from `state` (a generator of graphsafe_get_state, or any device generator) on."""
        if not isinstance(state, DeviceGenerator):
            raise RuntimeError(f"graphsafe_set_state takes a generator of the device, got "
                               f"{getattr(state, 'device', type(state).__name__)}")
        self.set_state(state.get_state())


class _GeneratorType(type(_TorchGenerator)):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _TorchGenerator)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _TorchGenerator)


def generator_class(device_index: Callable[[Any], int | None]) -> type:
    """What `torch.Generator` is inside the emulation. `device_index(device)` is the emulated
    device's index when `device` names cuda (raising for a bad ordinal), else None."""

    class Generator(_TorchGenerator, metaclass=_GeneratorType):
        __doc__ = _TorchGenerator.__doc__

        def __new__(cls, device: Any = "cpu"):
            index = device_index(device)
            if index is None:
                return _TorchGenerator(device=device)
            return DeviceGenerator(index)

    return Generator
