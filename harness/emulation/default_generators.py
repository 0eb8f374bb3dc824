"""`torch.cuda.default_generators` on the emulated device: one generator per device, each with a
state of its own, as CUDA's (CUDAGeneratorImpl.cpp).

Each holds CUDA's state, a seed and a Philox offset (device_rng.py, generators.py): `get_state()`
is 16 bytes, the seed as a uint64 then the offset as an int64; `get_offset()`/`set_offset()` answer
and move the offset; a random op on device i without a `generator=` draws from default generator
i and moves its offset by what CUDA's kernel would (rng_increments.py). The cpu's default generator
is apart: a cpu draw does not move a device generator, `torch.cuda.manual_seed` does not reseed the
cpu, and `torch.manual_seed` seeds both, as natively. Graph-safe states as on CUDA:
`graphsafe_get_state()` shares the state object in use, `clone_state()` copies it,
`graphsafe_set_state(g)` makes the generator use `g`'s object, during a capture too; a captured
draw binds to the state object in use when the capture meets it (the one in use at its beginning, or
one registered with the graph and swapped in), each replay drawing fresh values and advancing it.

What differs from CUDA: the values are the cpu kernels' drawn from a scratch cpu generator seeded
from (seed, offset), not Philox's; the offset increments take the emulated device's SM count (see
rng_increments.py); a new default generator starts from the cpu generator's initial seed (what a
`torch.manual_seed` before entering the emulation gives CUDA through its lazy seeding; an unseeded
CUDA generator starts from a random seed).
"""

from __future__ import annotations

from typing import Callable

import torch

from harness.emulation.device_rng import PhiloxState
from harness.emulation.generators import DeviceGenerator


class DefaultGenerators:
    """The default generators of `count` devices; `capturing()` says whether the current stream
    captures."""

    def __init__(self, count: int, capturing: Callable[[], bool]) -> None:
        seed = torch.initial_seed()
        self.generators = tuple(DeviceGenerator(i, PhiloxState(seed), capturing)
                                for i in range(count))

    def state_in_use(self, index: int) -> PhiloxState:
        """The state object a draw on device `index` without a generator= uses."""
        return self.generators[index].philox_state
