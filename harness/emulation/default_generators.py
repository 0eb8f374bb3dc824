"""`torch.cuda.default_generators` on the emulated device, with CUDA's graph-safe state objects.

On CUDA a generator holds its state (seed and Philox offset) in a CUDAGeneratorState object:
`graphsafe_get_state()` hands out a generator sharing that object (draws through one show in the
other), `clone_state()` one holding a copy, and `graphsafe_set_state(g)` makes the generator use
`g`'s object from then on; `graph.register_generator_state(g)` lets a capture draw from `g`, each
replay advancing it (CUDAGeneratorImpl.cpp, CUDAGraph.cpp).

Draws on the emulated device without a `generator=` come from the cpu's default generator
(generators.py), so the state object the default device generator uses now lives there: the
"active" one. The others keep theirs in a cpu generator of their own. `graphsafe_set_state` swaps:
the active state's values go back into its own object, the new one's into the cpu's default
generator. A `generator=` naming the default device generator, or the active state, is that
default generator; an inactive state draws from its own object, refused in a capture unless
registered with the graph, as any private generator (emulator/private_generators.py).

What differs from CUDA: `graphsafe_set_state` during a capture is refused by name
(`UnsupportedOnEmulatedDevice`): a replay draws from whatever state is active when it runs, so
the swap would have to be replayed as a step of its own, which the emulator does not record. The
states' `get_state()` is the cpu generator's (5056 bytes, not CUDA's 16), `get_offset()` is not
answered, and one state serves every emulated device (they share the cpu's default generator).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice
from harness.emulation.generators import DeviceGenerator



class GeneratorState(DeviceGenerator):
    """One CUDAGeneratorState of the default device generator, as a generator of the device (what
    `graphsafe_get_state()` and `clone_state()` return)."""

    def __new__(cls, index: int, states: "DefaultStates"):
        return super().__new__(cls, index)

    def __init__(self, index: int, states: "DefaultStates") -> None:
        super().__init__(index)
        self._states = states

    def is_active(self) -> bool:
        return self._states.active is self

    def _target(self) -> torch.Generator:
        return torch.default_generator if self.is_active() else _own(self)

    def get_state(self) -> torch.Tensor:
        return self._target().get_state()

    def set_state(self, new_state: torch.Tensor) -> "GeneratorState":
        self._target().set_state(new_state)
        return self

    def manual_seed(self, seed: int) -> "GeneratorState":
        self._target().manual_seed(seed)
        return self

    def seed(self) -> int:
        return self._target().seed()

    def initial_seed(self) -> int:
        return self._target().initial_seed()

    def graphsafe_get_state(self) -> "GeneratorState":
        return self

    def clone_state(self) -> "GeneratorState":
        return self._states.clone(self.index, self.get_state())

    def __repr__(self) -> str:
        return (f"<torch.Generator state object of cuda:{self.index}'s default generator "
                f"(emulated{', in use' if self.is_active() else ''})>")


def _own(state: GeneratorState) -> torch.Generator:
    """The cpu generator a state object is (its values while it is not the active one)."""
    return super(DeviceGenerator, state)


class DefaultDeviceGenerator(DeviceGenerator):
    """`torch.cuda.default_generators[index]`: every call goes to the state object in use."""

    def __new__(cls, index: int, states: "DefaultStates"):
        return super().__new__(cls, index)

    def __init__(self, index: int, states: "DefaultStates") -> None:
        super().__init__(index)
        self._states = states

    def get_state(self) -> torch.Tensor:
        return torch.default_generator.get_state()

    def set_state(self, new_state: torch.Tensor) -> "DefaultDeviceGenerator":
        torch.default_generator.set_state(new_state)
        return self

    def manual_seed(self, seed: int) -> "DefaultDeviceGenerator":
        torch.default_generator.manual_seed(seed)
        return self

    def seed(self) -> int:
        return torch.default_generator.seed()

    def initial_seed(self) -> int:
        return torch.default_generator.initial_seed()

    def graphsafe_get_state(self) -> GeneratorState:
        """The state object in use, shared: draws through either show in the other."""
        return self._states.active

    def graphsafe_set_state(self, state: torch.Generator) -> "DefaultDeviceGenerator":
        self._states.use(state)
        return self

    def clone_state(self) -> GeneratorState:
        """A state object holding a copy of the one in use."""
        return self._states.clone(self.index, self.get_state())

    def __repr__(self) -> str:
        return f"<torch.Generator object on cuda:{self.index} (emulated default generator)>"


class DefaultStates:
    """The default device generators and their state objects; `capturing()` says whether a
    capture is under way (a swap is refused then)."""

    def __init__(self, count: int, capturing: Callable[[], bool]) -> None:
        self._capturing = capturing
        self.active = GeneratorState(0, self)
        self.generators = tuple(DefaultDeviceGenerator(i, self) for i in range(count))

    def clone(self, index: int, values: torch.Tensor) -> GeneratorState:
        state = GeneratorState(index, self)
        _own(state).set_state(values)
        return state

    def use(self, state: Any) -> None:
        if isinstance(state, DefaultDeviceGenerator):
            state = self.active
        if not isinstance(state, GeneratorState):
            raise RuntimeError(f"graphsafe_set_state() takes a state object of the device's "
                               f"default generator (from graphsafe_get_state() or clone_state()), "
                               f"got {state!r}")
        if state is self.active:
            return
        if self._capturing():
            raise UnsupportedOnEmulatedDevice(
                "graphsafe_set_state() of the default CUDA generator during a capture: the "
                "emulated device replays draws from the state in use when the replay runs and "
                "does not record the swap; swap before capture_begin(), or draw from the state "
                "with generator=state after registering it with graph.register_generator_state()")
        previous = self.active
        _own(previous).set_state(torch.default_generator.get_state())
        torch.default_generator.set_state(_own(state).get_state())
        self.active = state

    def resolve(self, generator: Any) -> Any:
        """What a random op's `generator=` draws from: None (the cpu's default generator) for the
        default device generator or the state in use, else the generator itself."""
        if isinstance(generator, DefaultDeviceGenerator) or generator is self.active:
            return None
        return generator
