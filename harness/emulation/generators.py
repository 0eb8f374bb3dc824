"""`torch.Generator(device="cuda")` and `torch.cuda.default_generators` on the emulated device.

A device generator holds CUDA's state, a seed and a Philox offset in a `PhiloxState`
(device_rng.py): `get_state()` is CUDA's 16 bytes, `get_offset()`/`set_offset()` answer the offset,
`manual_seed()` resets it to 0, `seed()` takes a fresh 53-bit seed as CUDA does. The object is a
torch generator (`isinstance(g, torch.Generator)` holds, and the dispatcher takes it as a
`generator=`), over a cpu generator that only carries it through the dispatcher: its initial seed
is a tag by which `device_generator()` finds the device generator again from the plain
`torch.Generator` object an aten op receives. No kernel draws from it; draws are device_draws.py.

CUDA's graph-safe states: `graphsafe_get_state()` hands out a generator sharing this one's state
object (draws through either show in the other), `clone_state()` one holding a copy, and
`graphsafe_set_state(g)` makes this generator use `g`'s object from then on. During a capture,
`seed()`, `get_offset()` and `set_offset()` raise CUDA's assertNotCapturing error, `manual_seed()`
to another seed CUDA's set_current_seed error (the same seed is a no-op). `graphsafe_set_state()`
swaps during a capture as before one: the capture's draws bind to the state object in use when it
meets them, as CUDA's do, and one not registered with the graph raises CUDA's error there.
"""

from __future__ import annotations

import secrets
import weakref
from typing import Any, Callable

import torch

from harness import torch_internals
from harness.emulation import device_rng
from harness.emulation.device_rng import PhiloxState
from harness.graphs.emulator.private_generators import add_resolver

_TorchGenerator = torch_internals.Generator
_carriers: "weakref.WeakValueDictionary[int, DeviceGenerator]" = weakref.WeakValueDictionary()
_TAG_BITS = 63


def _not_capturing(attempt: str) -> RuntimeError:
    """at::cuda::assertNotCapturing's error."""
    return RuntimeError(f"{attempt} during CUDA graph capture. If you need this call to be "
                        f"captured, please file an issue. Current cudaStreamCaptureStatus: "
                        f"cudaStreamCaptureStatusActive")


class DeviceGenerator(_TorchGenerator):
    """A generator of the emulated device `index` drawing from `state` (a fresh one, seeded as
    CUDA seeds a new generator, by default); `capturing()` says whether the current stream
    captures."""

    def __new__(cls, index: int, state: PhiloxState | None = None,
                capturing: Callable[[], bool] | None = None):
        return super().__new__(cls, device="cpu")

    def __init__(self, index: int, state: PhiloxState | None = None,
                 capturing: Callable[[], bool] | None = None) -> None:
        self.index = index
        # at::default_rng_seed_val, what createCUDAGenerator seeds a new generator with
        self._rng = state if state is not None else PhiloxState(67280421310721)
        self._capturing = capturing or (lambda: False)
        tag = secrets.randbits(_TAG_BITS)
        while tag in _carriers:
            tag = secrets.randbits(_TAG_BITS)
        _TorchGenerator.manual_seed(self, tag)
        _carriers[tag] = self

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.index)

    @property
    def philox_state(self) -> PhiloxState:
        """The state object draws through this generator use and advance."""
        return self._rng

    def get_state(self) -> torch.Tensor:
        return device_rng.encode(self._rng)

    def set_state(self, new_state: torch.Tensor) -> "DeviceGenerator":
        seed, offset = device_rng.decode(new_state)
        self._set_seed(seed)
        self._rng.offset = offset
        return self

    def manual_seed(self, seed: Any) -> "DeviceGenerator":
        self._set_seed(device_rng.normalized_seed(seed))
        return self

    def _set_seed(self, seed: int) -> None:
        """CUDAGeneratorImpl::set_current_seed."""
        if self._capturing():
            if seed != self._rng.seed:
                from harness.emulation.rules import reseed_in_capture_error

                raise reseed_in_capture_error(self, seed)
            return
        self._rng.seed, self._rng.offset = seed, 0

    def seed(self) -> int:
        if self._capturing():
            raise _not_capturing("Cannot call CUDAGeneratorImpl::seed")
        seed = device_rng.nondeterministic_seed()
        self._set_seed(seed)
        return seed

    def initial_seed(self) -> int:
        return self._rng.seed

    def get_offset(self) -> int:
        if self._capturing():
            raise _not_capturing("Cannot call CUDAGeneratorImpl::get_offset")
        return self._rng.offset

    def set_offset(self, offset: int) -> "DeviceGenerator":
        if self._capturing():
            raise _not_capturing("Cannot call CUDAGeneratorImpl::set_offset")
        offset = int(offset)
        device_rng.check_offset(offset)
        self._rng.offset = offset
        return self

    def graphsafe_get_state(self) -> "DeviceGenerator":
        """A generator sharing this one's state object."""
        return DeviceGenerator(self.index, self._rng, self._capturing)

    def clone_state(self) -> "DeviceGenerator":
        """A generator holding a copy of this one's state. Refused during a capture, as
        CUDAGeneratorImpl::clone_impl refuses it (no graph-safe clone exists: a state to rewind to
        inside a capture is `torch.cuda.get_rng_state()`'s)."""
        if self._capturing():
            raise _not_capturing("Cannot call CUDAGeneratorImpl::clone_impl")
        return DeviceGenerator(self.index, self._rng.clone(), self._capturing)

    def graphsafe_set_state(self, state: Any) -> "DeviceGenerator":
        """Draw from `state`'s state object from now on (CUDAGeneratorImpl::graphsafe_set_state)."""
        if not isinstance(state, DeviceGenerator):
            raise RuntimeError(f"Expected a CUDA Generator (graphsafe_set_state takes a generator "
                               f"of the device, from graphsafe_get_state() or clone_state()), got "
                               f"{state!r}")
        # During a capture too: CUDA swaps the object on the host, and a captured draw binds to
        # the object in use when the capture meets it (device_draws.CaptureDraws), which must be
        # registered with the graph (AOTAutograd's graph-safe rng swaps so in a backward).
        self._rng = state._rng
        return self

    def __reduce__(self):
        return (_rebuilt, (self.index, self._rng.seed, self._rng.offset))

    def __repr__(self) -> str:
        return f"<torch.Generator object on cuda:{self.index} (emulated)>"


def _rebuilt(index: int, seed: int, offset: int) -> DeviceGenerator:
    return DeviceGenerator(index, PhiloxState(seed, offset))


def device_generator(generator: Any) -> DeviceGenerator | None:
    """The device generator `generator` is: itself, or the one a plain `torch.Generator` object
    (what an aten op receives for it) carries; None for any other generator."""
    if isinstance(generator, DeviceGenerator):
        return generator
    if not isinstance(generator, _TorchGenerator) or generator.device.type != "cpu":
        return None
    return _carriers.get(_TorchGenerator.initial_seed(generator))


add_resolver(device_generator)  # a capture tells a device generator from the object an op receives


class _GeneratorType(type(_TorchGenerator)):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _TorchGenerator)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _TorchGenerator)


def generator_class(device_index: Callable[[Any], int | None],
                    capturing: Callable[[], bool]) -> type:
    """What `torch.Generator` is inside the emulation. `device_index(device)` is the emulated
    device's index when `device` names cuda (raising for a bad ordinal), else None."""

    class Generator(_TorchGenerator, metaclass=_GeneratorType):
        __doc__ = _TorchGenerator.__doc__

        def __new__(cls, device: Any = "cpu"):
            index = device_index(device)
            if index is None:
                return _TorchGenerator(device=device)
            return DeviceGenerator(index, capturing=capturing)

    return Generator
