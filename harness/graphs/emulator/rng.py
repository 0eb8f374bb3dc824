"""Generator state inside an emulated capture, as CUDA's graph-safe generators treat it.

Under a CUDA capture, `get_rng_state`/`set_rng_state` of the capturing device's generator save and
rewind the graph's own position in the random stream, so a replay repeats a draw wherever the code
rewound (activation checkpointing with `preserve_rng_state` recomputes the forward's dropout mask).
The emulator records each get as a replay step that refreshes the returned state tensor and each set
as a step that restores it. Reseeding the device's generator with another seed is refused, as CUDA
refuses it; the same seed is a no-op, as on CUDA. Calls the emulator cannot intercept (methods of a
`torch.Generator` object) are caught afterwards: the generator's state must be unchanged by capture.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
import torch.cuda.random
import torch.random

from harness.graphs.base import CaptureError
from harness.graphs.emulator import cuda_errors
from harness.graphs.emulator.callsite import at_callsite, current_callsite
from harness.graphs.emulator.opinfo import ReplayStep


def _save_state(generator: torch.Generator, into: torch.Tensor) -> None:
    into.copy_(generator.get_state())


def is_state_step(fn: Any) -> bool:
    """Whether a replay step is the recording's RNG state bookkeeping (a saved state refreshed,
    a state set), not a node of CUDA's graph: a profiler counts no kernel for it."""
    return fn is _save_state or (isinstance(getattr(fn, "__self__", None), torch.Generator)
                                 and getattr(fn, "__name__", "") == "set_state")


class _RngRecording:
    def __init__(self, device: torch.device, steps: list[ReplayStep]) -> None:
        self.device = device
        self.generator = (torch.default_generator if device.type == "cpu"
                          else torch.cuda.default_generators[device.index])
        self.steps = steps
        self._saved: list[torch.Tensor] = []  # states a get returned: replay refreshes them

    def is_ours(self, device: Any) -> bool:
        """Whether a torch.cuda RNG call's `device` argument names the captured device."""
        if isinstance(device, int):
            return device == self.device.index
        device = torch.device(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        return device.type == self.device.type and index == self.device.index

    def get_state(self) -> torch.Tensor:
        state = self.generator.get_state()
        self.steps.append((_save_state, (self.generator, state), {}))
        self._saved.append(state)
        return state

    def set_state(self, state: torch.Tensor) -> None:
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
            raise TypeError(f"an RNG state is a torch.uint8 tensor, got {type(state).__name__}")
        if not any(state is saved for saved in self._saved):
            state = state.clone()  # a state from before capture: read once, as CUDA reads it
        self.steps.append((self.generator.set_state, (state,), {}))

    def fresh_seed(self, call: str) -> None:
        """`torch.cuda.seed()`/`seed_all()`: CUDAGeneratorImpl::seed asserts no capture before it
        draws a seed, so CUDA refuses it whatever the generator's seed."""
        raise CaptureError(cuda_errors.cuda_first(
            cuda_errors.not_capturing("Cannot call CUDAGeneratorImpl::seed"), at_callsite(
                f"{call} during capture asks the {self.device} generator the graph draws from for "
                f"a fresh random seed: seed before capture", current_callsite())), op=call)

    def reseed(self, call: str, seed: int | None) -> bool:
        """Refuse a reseed to another seed; True when the call may go on (same seed: a no-op)."""
        current = self.generator.initial_seed()
        if seed is not None and int(seed) == current:
            return False
        asked = "a fresh random seed" if seed is None else f"seed {seed}"
        raise CaptureError(cuda_errors.cuda_first(cuda_errors.RESEED, at_callsite(
            f"{call} during capture reseeds the {self.device} generator the graph draws from with "
            f"{asked}, but it was seeded with {current}; CUDA allows only the same seed: seed "
            f"before capture", current_callsite())), op=call)


def _patches(rng: _RngRecording) -> list[tuple[Any, str, Callable]]:
    if rng.device.type == "cpu":
        def manual_seed(seed):
            rng.reseed("torch.manual_seed", seed)
            return torch.default_generator

        def seed():
            rng.reseed("torch.seed", None)

        get, set_ = (lambda: rng.get_state()), (lambda new_state: rng.set_state(new_state))
        return [(module, name, fn) for module in (torch, torch.random)
                for name, fn in (("get_rng_state", get), ("set_rng_state", set_),
                                 ("manual_seed", manual_seed), ("seed", seed))]

    cuda_get, cuda_set = torch.cuda.random.get_rng_state, torch.cuda.random.set_rng_state

    def get_rng_state(device="cuda"):
        return rng.get_state() if rng.is_ours(device) else cuda_get(device)

    def set_rng_state(new_state, device="cuda"):
        return rng.set_state(new_state) if rng.is_ours(device) else cuda_set(new_state, device)

    def cuda_manual_seed(seed):
        rng.reseed("torch.cuda.manual_seed", seed)

    def cuda_manual_seed_all(seed):
        rng.reseed("torch.cuda.manual_seed_all", seed)

    def cuda_seed():
        rng.fresh_seed("torch.cuda.seed")

    def cuda_seed_all():
        rng.fresh_seed("torch.cuda.seed_all")

    def manual_seed(seed):
        rng.reseed("torch.manual_seed", seed)
        return torch.default_generator.manual_seed(seed)  # the host generator is not captured

    def seed():
        rng.reseed("torch.seed", None)

    cuda = [(module, name, fn) for module in (torch.cuda, torch.cuda.random)
            for name, fn in (("get_rng_state", get_rng_state), ("set_rng_state", set_rng_state),
                             ("manual_seed", cuda_manual_seed), ("manual_seed_all", cuda_manual_seed_all),
                             ("seed", cuda_seed), ("seed_all", cuda_seed_all))]
    return cuda + [(module, name, fn) for module in (torch, torch.random)
                   for name, fn in (("manual_seed", manual_seed), ("seed", seed))]


@contextlib.contextmanager
def rng_recorded(device: torch.device, steps: list[ReplayStep]) -> Iterator[None]:
    """For the duration, generator state changes of `device`'s generator go into `steps`."""
    rng = _RngRecording(device, steps)
    before = rng.generator.get_state()
    patches = _patches(rng)
    saved = [(module, name, module.__dict__[name]) for module, name, _ in patches]
    try:
        for module, name, fn in patches:
            setattr(module, name, fn)
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)
    if not torch.equal(rng.generator.get_state(), before):
        raise CaptureError(
            f"the {device} generator's state changed during capture through a call the emulator "
            f"cannot record (a method of the torch.Generator object: set_state, manual_seed, "
            f"seed); use torch.get_rng_state/set_rng_state (torch.cuda.* on a cuda device), which "
            f"a capture records, or change the state before capture", op="Generator.set_state")
