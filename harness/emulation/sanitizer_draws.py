"""Which state object a graph sanitizer capture's random ops draw from at replay.

The sanitizer's generators are CUDA's own. A random op of its capture that names no generator
draws from the device's default generator, whose state in use at that moment may be one swapped
in for the capture (`graphsafe_set_state`: AOTAutograd's graph-safe rng does it around a
checkpointed backward's draw). On CUDA the graph keeps drawing from that state object at every
replay (its registered state's seed and offset). A recorded step that names no generator would
draw from whatever state is in use at replay instead, so each random op's steps run with the
state in use at capture swapped in for the call, and the state in use before put back after.
Ops given a generator draw from it as recorded (private_generators.py checks it is registered).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from harness.emulation.device_draws import given_generator, is_random


def _draw_from(generator: torch.Generator, state: torch.Generator, fn: Any, args: tuple,
               kwargs: dict) -> Any:
    """A recorded step of a random op, drawing from `state` through the default `generator`."""
    in_use = generator.graphsafe_get_state()
    generator.graphsafe_set_state(state)
    try:
        return fn(*args, **kwargs)
    finally:
        generator.graphsafe_set_state(in_use)


class SanitizerDraws:
    """The recorder's `draws` for a capture on the sanitizer's `device`."""

    def __init__(self, device: torch.device, on_draw: Callable[[], None] | None = None) -> None:
        self.generator = torch.cuda.default_generators[device.index]
        self.on_draw = on_draw  # told of each random op of the capture that names no generator

    def source(self, func: Any, args: tuple, kwargs: dict) -> torch.Generator | None:
        """The default generator's state in use, for a random op naming no generator."""
        if not is_random(func) or given_generator(func, args, kwargs) is not None:
            return None
        if self.on_draw is not None:
            self.on_draw()
        get_state = getattr(self.generator, "graphsafe_get_state", None)
        return None if get_state is None else get_state()  # a torch without graph-safe states

    def replay_steps(self, steps: list, func: Any, args: tuple, kwargs: dict, out: Any,
                     state: torch.Generator) -> list:
        return [(_draw_from, (self.generator, state, fn, step_args, step_kwargs), {})
                for fn, step_args, step_kwargs in steps]
