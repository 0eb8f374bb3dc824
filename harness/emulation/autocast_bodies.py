"""torch.nn.functional's Python functions under `torch.autocast("cuda")` on the emulated device.

CUDA's autocast casts at each aten op, so a Python function such as
`F.multi_head_attention_forward` gets its `linear`s and `bmm`s in the autocast dtype and its
`softmax` in float32. The placement mode meets such a function as one torch call and runs it with
itself popped, so the ops inside would go uncast. Under autocast it runs the function's body with
the mode pushed again instead, so each torch call inside is cast as CUDA casts it; the body's own
first check (`has_torch_function...`, which would hand the call straight back to the mode) is told
"no" once, on that thread. torch.nn.functional's three checks are wrapped for the emulation's
duration to allow that; without a pending body on the thread they answer as torch's do.
"""

from __future__ import annotations

import contextlib
import threading
import types
from typing import Any, Callable, Iterator

import torch.nn.functional as F

_CHECKS = ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic")


class BodyChecks:
    """The threads of one emulated device whose next torch.nn.functional check answers False."""

    def __init__(self) -> None:
        self._local = threading.local()

    def wrap(self, check: Callable[..., bool]) -> Callable[..., bool]:
        local = self._local

        def checked(*args) -> bool:
            if getattr(local, "pending", False):
                local.pending = False
                return False
            return check(*args)

        return checked

    def pending(self) -> bool:
        """Whether this thread's next check is still to answer False: a call met now comes from
        a body that reached the modes without asking the wrapped checks (it runs popped then)."""
        return getattr(self._local, "pending", False)

    @contextlib.contextmanager
    def next_check_passes(self) -> Iterator[None]:
        self._local.pending = True
        try:
            yield
        finally:
            self._local.pending = False


def runs_its_body(func: Any) -> bool:
    """Whether `func` is a Python function of torch.nn.functional (one that hands itself to the
    torch function modes from its first check)."""
    return type(func) is types.FunctionType and func.__module__ == F.__name__


def patches(state) -> list[tuple[Any, str, Any]]:
    """torch.nn.functional's checks, wrapped by the state's `BodyChecks`."""
    return [(F, name, state.autocast_bodies.wrap(getattr(F, name))) for name in _CHECKS]


__all__ = ["BodyChecks", "patches", "runs_its_body"]
