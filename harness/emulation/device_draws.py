"""Random ops on the emulated device draw from a device generator, as on CUDA.

A random aten op (one with an overload taking a `Generator?`, or native_dropout and the `*_like`
factories, which draw from the default generator without one) on the device draws from the state object (device_rng.PhiloxState)
of its `generator=` (a device generator, generators.py) or of its device's default generator: the
cpu kernel runs on a scratch cpu generator seeded from the state's (seed, offset), handed to it as
its generator (or put in the cpu's default generator for the call, and the cpu's state restored
after), then the offset moves by CUDA's increment for the op (rng_increments.py). So device draws
never touch the cpu's generator, and a state set back repeats them.

Eager calls: the placement mode runs a device call that may draw (`may_draw`) under `EagerDraws`, a
dispatch mode that meets its aten ops; no other call pays for it. A capture records each random op
as a step drawing at replay time from the state object resolved at capture (`replay_draw`), so
each replay draws fresh values and moves the offset by the graph's whole increment, as CUDA's
replay_prologue does.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from harness import torch_internals
from harness.torch_internals import (TorchDispatchMode, get_current_dispatch_mode_stack,
                                     len_torch_dispatch_stack as _stack_length, tree_map_only)
from harness.emulation import rng_increments
from harness.emulation.device_rng import PhiloxState, scratch_seed
from harness.emulation.generators import device_generator
from harness.graphs.emulator.dispatch_keys import keep_modes_reachable
from harness.graphs.emulator.recorder import Recorder
from harness.graphs.emulator.tensor_subclasses import defer_to_subclass

# ops that draw from the default generator and have no overload taking one
_DRAW_WITHOUT_GENERATOR = frozenset({"native_dropout", "rand_like", "randn_like", "randint_like"})

_F = torch.nn.functional
_T = torch.Tensor
# torch-level calls that reach a random aten op (the placement mode sees these, not aten ops).
# Python functions of torch (F.dropout, nn.init, torch.distributions) call torch functions the mode
# sees one by one, or are listed here when torch hands the whole call to the mode.
_RANDOM_CALLS = frozenset(f for f in (
    torch.rand, torch.rand_like, torch.randn, torch.randn_like, torch.randint, torch.randint_like,
    torch.randperm, torch.normal, torch.bernoulli, torch.multinomial, torch.poisson,
    torch.binomial, torch_internals.standard_gamma, torch_internals.sample_dirichlet,
    torch.dropout, torch.dropout_, torch.alpha_dropout, torch.alpha_dropout_, torch.feature_dropout,
    torch.feature_dropout_, torch.feature_alpha_dropout, torch.feature_alpha_dropout_,
    torch.native_dropout, torch.rrelu, torch.rrelu_,
    getattr(torch_internals.nn_module, "rrelu_with_noise", None),
    getattr(torch_internals.nn_module, "rrelu_with_noise_", None),
    _T.uniform_, _T.normal_, _T.bernoulli, _T.bernoulli_, _T.random_, _T.exponential_,
    _T.cauchy_, _T.log_normal_, _T.geometric_, _T.multinomial,
    _F.dropout, _F.dropout1d, _F.dropout2d, _F.dropout3d, _F.alpha_dropout,
    _F.feature_alpha_dropout, _F.rrelu, _F.rrelu_, _F.gumbel_softmax,
    _F.scaled_dot_product_attention, _F.multi_head_attention_forward,
    _F.fractional_max_pool2d, _F.fractional_max_pool3d,
    getattr(_F, "fractional_max_pool2d_with_indices", None),
    getattr(_F, "fractional_max_pool3d_with_indices", None),
    torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu,
    torch.nn.init.uniform_, torch.nn.init.normal_, torch.nn.init.trunc_normal_,
    torch.nn.init.xavier_uniform_, torch.nn.init.xavier_normal_, torch.nn.init.kaiming_uniform_,
    torch.nn.init.kaiming_normal_, torch.nn.init.orthogonal_, torch.nn.init.sparse_,
) if f is not None)


def may_draw(func: Any, kwargs: dict) -> bool:
    """Whether a torch-level call may reach a random aten op (placement.py asks): a random aten op
    called itself (AOTAutograd's graphs run as eager code call them so) is one."""
    # is_random inlined: every device call asks
    return (func in _RANDOM_CALLS or kwargs.get("generator") is not None
            or (isinstance(func, torch_internals.OpOverload) and _random_packet(func.overloadpacket)))


def dispatch_modes_off() -> bool:
    """Whether dispatch modes are off here (under `no_dispatch()`: a dispatch mode's own rule for
    a higher-order operator runs the op inside so): EagerDraws would not meet a random aten op,
    so `EagerDraws.draw_call` draws it."""
    return torch_internals.dispatch_tls_is_dispatch_key_excluded(
        torch_internals.DISPATCH_KEY_PYTHON)


def recorded() -> bool:
    """Whether a recorder (a capture's, or the capture lint's) meets the aten ops: it sees the
    call's generators as given, and a capture's replay draws (`CaptureDraws`)."""
    return _stack_length() > 0 and any(isinstance(mode, Recorder)
                                       for mode in get_current_dispatch_mode_stack())


@functools.lru_cache(maxsize=None)
def _generator_position(func: Any) -> int | None:
    """The index of the op's Generator argument in its schema; None without one."""
    for i, argument in enumerate(func._schema.arguments):
        if "Generator" in str(argument.type):
            return i
    return None


@functools.lru_cache(maxsize=None)
def _random_packet(packet: Any) -> bool:
    """Whether any overload of an op takes a Generator: those without one (randn.default,
    randint.low) draw from the default generator as much as those with one."""
    for name in packet.overloads():
        if _generator_position(getattr(packet, name)) is not None:
            return True
    return packet.__name__ in _DRAW_WITHOUT_GENERATOR


def is_random(func: Any) -> bool:
    return isinstance(func, torch_internals.OpOverload) and _random_packet(func.overloadpacket)


def given_generator(func: Any, args: tuple, kwargs: dict) -> Any:
    """The Generator the op was handed (positionally or by name), None without one."""
    position = _generator_position(func)
    if position is None:
        return None
    if len(args) > position:
        return args[position]
    return kwargs.get(func._schema.arguments[position].name)


class Draws:
    """The device's draws: `defaults` its default generators, `sm_count` its SM count (the launch
    configuration CUDA's increments depend on)."""

    def __init__(self, defaults: Any, sm_count: int) -> None:
        self.defaults = defaults
        self.sm_count = sm_count

    def source(self, func: Any, args: tuple, kwargs: dict, index: int) -> PhiloxState | None:
        """The state object the op draws from: its generator='s, else device `index`'s default
        generator's; None for a generator not of the device (a cpu one, refused elsewhere)."""
        given = given_generator(func, args, kwargs)
        if given is None:
            return self.defaults.state_in_use(index)
        generator = device_generator(given)
        return None if generator is None else generator.philox_state

    def increment(self, func: Any, args: tuple, kwargs: dict, out: Any) -> int:
        return rng_increments.increment(func, args, kwargs, out, self.sm_count)

    def draw(self, func: Any, args: tuple, kwargs: dict, state: PhiloxState,
             increment: int | None = None) -> Any:
        """Run the op on values drawn at `state`'s (seed, offset), then move the offset by
        `increment` (CUDA's for this op, when None)."""
        if state.capturing:  # an eager draw: CUDAGeneratorState::increment's check
            raise RuntimeError("Offset increment outside graph capture encountered unexpectedly.")
        out = _drawing(scratch_seed(state.seed, state.offset), func, args, kwargs)
        state.advance(self.increment(func, args, kwargs, out) if increment is None else increment)
        return out


def _drawing(seed: int, func: Any, args: tuple, kwargs: dict) -> Any:
    """`func(*args, **kwargs)` drawing from a scratch cpu generator seeded `seed`: an op whose
    schema takes a generator is handed it there; anything else has its generator objects replaced
    by it and the cpu's default generator seeded the same for the call."""
    scratch = torch.Generator()
    scratch.manual_seed(seed)
    position = (_generator_position(func) if isinstance(func, torch_internals.OpOverload)
                else None)
    if position is None:
        args, kwargs = tree_map_only(torch.Generator, lambda _: scratch, (args, kwargs))
        return _with_default_generator(seed, func, args, kwargs)
    if len(args) > position:
        args = (*args[:position], scratch, *args[position + 1:])
    else:
        kwargs = {**kwargs, func._schema.arguments[position].name: scratch}
    return func(*args, **kwargs)


def _with_default_generator(seed: int, func: Any, args: tuple, kwargs: dict) -> Any:
    """An op that draws from the cpu's default generator itself: the scratch seed is put there for
    the call, the cpu's own state restored after."""
    cpu = torch.default_generator
    saved = cpu.get_state()
    cpu.manual_seed(seed)
    try:
        return func(*args, **kwargs)
    finally:
        cpu.set_state(saved)


def replay_draw(state: PhiloxState, increment: int, fn: Any, args: tuple, kwargs: dict) -> Any:
    """A recorded step `fn(*args, **kwargs)` of a random op, drawing from `state` at replay."""
    out = _drawing(scratch_seed(state.seed, state.offset), fn, args, kwargs)
    state.advance(increment)
    return out


class CaptureDraws:
    """What a capture on device `index` asks (the recorder's `draws`): which state object a random
    op draws from, and its recorded step made to draw from it at each replay."""

    def __init__(self, draws: Draws, index: int,
                 on_draw: Callable[[PhiloxState], None] | None = None) -> None:
        self.draws = draws
        self.index = index
        self.on_draw = on_draw  # told of each state a random op of the capture draws from

    def source(self, func: Any, args: tuple, kwargs: dict) -> PhiloxState | None:
        if not is_random(func):
            return None
        state = self.draws.source(func, args, kwargs, self.index)
        if (state is not None and not state.capturing
                and given_generator(func, args, kwargs) is None):
            # The default generator draws from the state object in use now: one swapped in
            # during the capture (graphsafe_set_state) takes part only if registered with the
            # graph, whose capture prologue marked it (a generator= of its own is checked by the
            # recorder, private_generators.py)
            raise _unregistered_default_state(func)
        if state is not None and self.on_draw is not None:
            self.on_draw(state)
        return state

    def replay_steps(self, steps: list, func: Any, args: tuple, kwargs: dict, out: Any,
                     state: PhiloxState) -> list:
        """`steps`, recorded for one random op, drawing from `state`; the last moves its offset
        by the op's increment."""
        increment = self.draws.increment(func, args, kwargs, out)
        last = len(steps) - 1
        return [(replay_draw, (state, increment if i == last else 0, fn, step_args, step_kwargs), {})
                for i, (fn, step_args, step_kwargs) in enumerate(steps)]


def _unregistered_default_state(func: Any):
    from harness.graphs.base import CaptureError
    from harness.graphs.emulator.callsite import at_callsite, current_callsite
    from harness.graphs.emulator.opinfo import op_name
    from harness.graphs.emulator.private_generators import CUDA_UNREGISTERED

    return CaptureError(at_callsite(
        f"{CUDA_UNREGISTERED} {op_name(func)} draws from the device's default generator, whose "
        f"state object was swapped (graphsafe_set_state) for one not registered with the graph "
        f"being captured: register that state with graph.register_generator_state(state) before "
        f"capture", current_callsite()), op=op_name(func))


class EagerDraws(TorchDispatchMode):
    """For one eager device call on device `index`: its random aten ops draw from the device."""

    def __init__(self, draws: Draws, index: int) -> None:
        super().__init__()
        self.draws = draws
        self.index = index

    def __enter__(self):
        out = super().__enter__()
        keep_modes_reachable()
        return out

    def draw_call(self, func, args: tuple, kwargs: dict):
        """`func`, a random aten op, called itself where this mode would not meet it."""
        return self.__torch_dispatch__(func, (), args, kwargs)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if types and defer_to_subclass(types):
            return NotImplemented  # the subclass's own dispatch first (tensor_subclasses.py)
        kwargs = kwargs or {}
        if not is_random(func):
            return func(*args, **kwargs)
        state = self.draws.source(func, args, kwargs, self.index)
        if state is None:
            return func(*args, **kwargs)
        return self.draws.draw(func, args, kwargs, state)
