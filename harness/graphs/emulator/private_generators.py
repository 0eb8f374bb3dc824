"""Random ops that draw from a `torch.Generator` of their own during capture, as CUDA treats them.

CUDA's graph-safe generators: the device's default generator takes part in every capture, and any
other generator only once registered with the graph (`graph.register_generator_state(gen)`); then
each replay advances it and draws fresh values, as the emulator's replay of the op does. An
unregistered generator is refused when the capture meets its first draw ("Attempt to increase
offset for a CUDA generator not in capture mode.", measured on torch 2.10 and 2.11 with CUDA): the
emulator refuses it at the same point, with the op, the user's line and the remedy."""

from __future__ import annotations

from typing import Any, Callable

import torch

from harness.graphs.base import CaptureError
from harness.graphs.emulator.callsite import at_callsite, current_callsite
from harness.graphs.emulator.opinfo import op_name

CUDA_UNREGISTERED = "Attempt to increase offset for a CUDA generator not in capture mode."


def private_generator(kwargs: dict[str, Any], device: torch.device) -> torch.Generator | None:
    """The generator an op's `generator=` names when it is not `device`'s default one, else None."""
    generator = kwargs.get("generator")
    if not isinstance(generator, torch.Generator) or _is_default(generator, device):
        return None
    return generator


def _is_default(generator: torch.Generator, device: torch.device) -> bool:
    if same_generator(generator, torch.default_generator):
        return True
    # The emulated CUDA device records on the cpu that holds its memory: its generators say whose.
    on_cuda = device.type == "cuda" or hasattr(_resolved(generator), "philox_state")
    if on_cuda and torch.cuda.is_available():
        return any(same_generator(generator, g) for g in torch.cuda.default_generators)
    return False


def is_registered(generator: torch.Generator, registered: tuple[torch.Generator, ...]) -> bool:
    return any(same_generator(generator, g) for g in registered)


# Resolvers of the plain generator object an aten op receives to a generator of an emulated device
# (one with a `philox_state`), installed by that device (harness.emulation.generators).
_resolvers: list[Callable[[Any], Any]] = []


def add_resolver(resolver: Callable[[Any], Any]) -> None:
    if resolver not in _resolvers:
        _resolvers.append(resolver)


def _resolved(generator: Any) -> Any:
    for resolver in _resolvers:
        found = resolver(generator)
        if found is not None:
            return found
    return generator


def same_generator(a: torch.Generator, b: torch.Generator) -> bool:
    """Whether two Python generators stand for one generator. The dispatcher hands an op a fresh
    Python object for a generator made by `torch.Generator()`, so identity says nothing: reseed one
    and see whether the other follows, then restore the state both share. Generators of an emulated
    device are one where they share their state object (what CUDA registers with a graph)."""
    if a is b:
        return True
    a, b = _resolved(a), _resolved(b)
    state_a, state_b = getattr(a, "philox_state", None), getattr(b, "philox_state", None)
    if state_a is not None or state_b is not None:
        return state_a is state_b
    state = b.get_state()
    if state.shape != a.get_state().shape or not torch.equal(state, a.get_state()):
        return False
    probe = (b.initial_seed() + 1) % (1 << 63)
    b.manual_seed(probe)
    try:
        return a.initial_seed() == probe
    finally:
        b.set_state(state)


def unregistered_generator_error(func: Any, generator: torch.Generator) -> CaptureError:
    return CaptureError(at_callsite(
        f"{CUDA_UNREGISTERED} {op_name(func)} draws from its own generator (a torch.Generator seeded "
        f"with {_resolved(generator).initial_seed()}), which is not registered with the graph being captured: register it before capture with "
        f"graph.register_generator_state(generator), so that each replay advances it and draws "
        f"fresh values, or draw from the device's default generator", current_callsite()),
        op=op_name(func))
