"""Putting replacements of torch's attributes in place for an emulation's duration, and restoring
each exactly as it was on exit (a name that was absent is removed again)."""

from __future__ import annotations

import contextlib
from typing import Any

_MISSING = object()


def apply(patches: list[tuple[Any, str, Any]], stack: contextlib.ExitStack) -> None:
    """Set each `(owner, name, value)`; `stack`'s exit undoes them in reverse order."""
    saved = [(owner, name, owner.__dict__.get(name, _MISSING) if hasattr(owner, "__dict__")
              else getattr(owner, name, _MISSING)) for owner, name, _ in patches]

    def restore() -> None:
        for owner, name, original in reversed(saved):
            if original is _MISSING:
                if name in getattr(owner, "__dict__", {}):
                    delattr(owner, name)
            else:
                setattr(owner, name, original)

    stack.callback(restore)
    for owner, name, value in patches:
        setattr(owner, name, value)
