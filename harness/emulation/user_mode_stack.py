"""The device's own dispatch modes stay below a user's, as CUDA's capture and replay do.

On CUDA a capture is no dispatch mode: a user's `TorchDispatchMode` entered before
`capture_begin()` sees each captured op as the program issues it (its device tensors, its
result), and nothing else, and a replay is one launch that reaches no mode at all. The emulated
capture is a stack of dispatch modes (the recorder, the capture's stream rules) pushed by
`capture_begin()`. Pushed above a user's mode, they took every op first: the user's mode saw
the recorder's bookkeeping (shape inference on meta tensors, pool allocations, a poison fill,
`equal`) in place of the captured op, and a replay issued where no stream tracking runs it apart
reached the user's mode op by op.

`below_users_modes()` runs a capture's beginning and end with the user's modes (and any mode
above the lowest of them) lifted off torch's stack and put back on top afterwards, so the
capture's modes go in below them and come out from below them (torch's `__exit__` pops whatever
is on top). `users_modes_suspended()` runs a replay without the user's modes; the device's own
modes among and above them (the graph sanitizer's real-stream tracking) stay, in their order.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from harness import torch_internals
from harness.graphs.emulator.dispatch_keys import keep_modes_reachable


def is_users_mode(mode: Any) -> bool:
    """A mode whose author wrote it for CUDA tensors: not torch's infrastructure (fake tensors,
    functionalization, tracing, which follow the tensors' true device) nor the device's own."""
    if mode.__dict__.get("_dispatch_key") is not None or getattr(mode, "_mode_key", None) is not None:
        return False
    infra = getattr(type(mode), "is_infra_mode", None)
    if infra is not None and infra():
        return False
    return not type(mode).__module__.startswith("harness.")


def _lift_from_the_lowest_users_mode() -> list:
    """Pop the lowest user's mode and every mode above it off the dispatch-mode stack; returns
    them bottom first ([] where no user's mode is on the stack). torch's infrastructure modes
    are the stack's bottom (TorchDispatchModeTLS), so they are never among them."""
    if not torch_internals.len_torch_dispatch_stack():
        return []
    stack = torch_internals.get_current_dispatch_mode_stack()
    lowest = next((i for i, mode in enumerate(stack) if is_users_mode(mode)), None)
    if lowest is None:
        return []
    lifted = [torch_internals.pop_mode() for _ in range(len(stack) - lowest)]
    lifted.reverse()
    return lifted


def _push(modes: list) -> None:
    for mode in modes:
        torch_internals.push_mode(mode)
    if modes:
        keep_modes_reachable()


@contextlib.contextmanager
def below_users_modes() -> Iterator[None]:
    """The body's pushes and pops of dispatch modes happen below the user's modes."""
    lifted = _lift_from_the_lowest_users_mode()
    try:
        yield
    finally:
        _push(lifted)


@contextlib.contextmanager
def users_modes_suspended() -> Iterator[None]:
    """The body runs without the user's dispatch modes; the device's own stay, in their order.
    The body leaves the stack as it found it."""
    lifted = _lift_from_the_lowest_users_mode()
    kept = [mode for mode in lifted if not is_users_mode(mode)]
    _push(kept)
    try:
        yield
    finally:
        for _ in kept:
            torch_internals.pop_mode()
        _push(lifted)
