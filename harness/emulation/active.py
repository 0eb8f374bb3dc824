"""The emulation in force, if any: what the replaced `torch.cuda` functions, streams, events and
`CUDAGraph` find their device through, as torch's own find the real one through the CUDA runtime.

It imports nothing of the device, so every module of it may ask (session.py enters and leaves;
the rest only read): the bottom of harness/emulation's import order.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

# At most one emulation at a time (session.py refuses a second): its state while it is entered.
_ACTIVE: list[Any] = []


def active_state():
    """The device state of the emulation in force (RuntimeError when none is)."""
    if not _ACTIVE:
        raise RuntimeError("the emulated CUDA device is not active: this object belongs to "
                           "harness.emulate_cuda(), which has exited")
    return _ACTIVE[-1]


def emulation_active() -> str | None:
    """"cpu" (the emulated device), "cuda" (the graph sanitizer on a real GPU) or None."""
    return _ACTIVE[-1].kind if _ACTIVE else None


def is_in_force(state) -> bool:
    """Whether `state` is among the emulations in force (threads started inside it ask)."""
    return any(active is state for active in _ACTIVE)


@contextlib.contextmanager
def in_force(state) -> Iterator[Any]:
    """`state` is the emulation in force for the duration."""
    _ACTIVE.append(state)
    try:
        yield state
    finally:
        _ACTIVE.pop()
