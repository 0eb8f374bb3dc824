"""`--emulate-cuda`: the whole session inside `harness.emulate_cuda()`, entered before anything asks
torch.cuda (collection included) and left when pytest unconfigures; a strict race found when a
test's tensors were freed fails that test."""

from __future__ import annotations

import contextlib
import sys

import pytest

from harness.pytest_plugin.options import DeviceChoice, device_choice, for_a_real_gpu

_emulation = pytest.StashKey[contextlib.ExitStack]()
_choice = pytest.StashKey[DeviceChoice]()
_base_modes = pytest.StashKey[int]()  # function modes the emulation keeps on the stack
_TORCH_TESTCASE = "torch.testing._internal.common_utils"


def enter(config: pytest.Config) -> None:
    if _emulation in config.stash:
        return
    choice = device_choice(config)  # refuses device options without --emulate-cuda
    if choice is None:
        return
    import torch

    from harness.emulation import emulation_active

    # An xdist worker inherits the controller's emulated device (children=True) as it imports
    # torch: torch.cuda then answers for the emulation, not for a GPU.
    if torch.cuda.is_available() and emulation_active() != "cpu":
        choice = for_a_real_gpu(choice, config)
    from harness import emulate_cuda

    stack = contextlib.ExitStack()
    stack.enter_context(emulate_cuda(children=True, **choice.device.emulate_cuda_kwargs()))
    config.stash[_emulation] = stack
    config.stash[_choice] = choice
    from harness import torch_internals

    config.stash[_base_modes] = torch_internals.len_torch_function_stack()


def align_torch_testcase(config: pytest.Config) -> None:
    """PyTorch's own TestCase checks at tearDown that the function-mode stack is as long as at
    setUp, and a subclass whose setUp skips super()'s compares with the class default, 0: the
    length natively, where nothing is on the stack. Inside the emulation its own modes are there
    for the whole session, so that default is their count (test_cuda_sanitizer.py's
    TestEventHandler failed, and its tearDown popped the emulation's placement mode)."""
    base = config.stash.get(_base_modes, 0)
    if active(config) and base:
        _set_testcase_mode_stack_default(base)


def _set_testcase_mode_stack_default(length: int) -> None:
    """PyTorch's TestCase class default for the function-mode stack's length, where its module
    has been imported (nothing to do otherwise)."""
    module = sys.modules.get(_TORCH_TESTCASE)
    if module is not None:
        module.TestCase._prev_torch_function_mode_stack_len = length


def active(config: pytest.Config) -> bool:
    return _emulation in config.stash


def chosen_device(config: pytest.Config) -> DeviceChoice | None:
    return config.stash.get(_choice, None)


def header(config: pytest.Config) -> list[str]:
    choice = chosen_device(config)
    if choice is None:
        return []
    lines = [f"harness: under {choice.device}"]
    lines += [f"harness: ini {setting} left out: it sets the emulated device, and on this machine "
              f"--emulate-cuda is the graph sanitizer on the real GPU" for setting in choice.ignored_ini]
    return lines


def leave(config: pytest.Config) -> None:
    stack = config.stash.get(_emulation, None)
    if stack is not None:
        del config.stash[_emulation]
        stack.close()
        if config.stash.get(_base_modes, 0):
            _set_testcase_mode_stack_default(0)


def session_device(config: pytest.Config) -> str | None:
    """"cuda" under --emulate-cuda, where the fixtures put the session on the (emulated) device."""
    return "cuda" if active(config) else None


def late_races(*, test_ended: bool = False) -> list:
    """Strict races found where raising was impossible; `test_ended`: with the races of blocks the
    test freed on a default stream that the next test's allocations would meet."""
    from harness.emulation import emulation_active
    from harness.emulation.session import active_state

    if emulation_active() != "cpu":
        return []
    tracking = getattr(active_state(), "streams_tracking", None)
    return [] if tracking is None else tracking.take_late_races(test_ended=test_ended)


class LeftStreamError(RuntimeError):
    """A test left a stream other than the default current on the session's device: every later
    test of its worker would issue its work there, and its frees would race with it."""


def end_generators_left_capturing() -> int:
    """Between tests, end the capture state a failed capture left on the emulated device's default
    generators, as a test's own process would start without it (natively, tests that fail a real
    capture run in a process of their own); within the test CUDA's stuck state holds. How many
    generators were left so (the graph sanitizer's are the GPU's own: 0)."""
    from harness.emulation.active import active_state

    return active_state().end_generators_left_capturing()


def restore_default_stream(nodeid: str) -> None:
    """Make the default stream current again where a test left another, and raise naming the test
    and the stream (the test's bug: a `torch.cuda.set_stream` with no way back, or a stream
    context left open)."""
    import torch

    current, default = torch.cuda.current_stream(), torch.cuda.default_stream()
    if current == default:
        return
    torch.cuda.set_stream(default)
    raise LeftStreamError(
        f"{nodeid} left {current} current (the default stream is {default}); the harness made the "
        f"default stream current again for the next test. Remedy: select a stream with "
        f"`with torch.cuda.stream(s):`, which restores the one before it, or set the default back "
        f"before the test ends")
