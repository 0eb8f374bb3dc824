"""Planting a fault: replace a function for the duration of a context, wherever it is bound.

A module that did `from harness.ops.attention import write_kv` holds its own reference, so
replacing the name in one module would miss it. `replace_function` rebinds the name in every
loaded module that holds the original, and modules imported while the fault is planted (test
modules collected after the session starts) import the replacement from the patched module.
"""

from __future__ import annotations

import contextlib
import sys
from types import ModuleType
from typing import Any, Callable, Iterator


def _holders(name: str, obj: Any) -> list[ModuleType]:
    return [module for module in list(sys.modules.values())
            if isinstance(module, ModuleType) and vars(module).get(name) is obj]


@contextlib.contextmanager
def replace_function(module: ModuleType, name: str,
                     make: Callable[[Callable], Callable]) -> Iterator[None]:
    """Bind `make(original)` to `name` in `module` and in every module holding the original."""
    original = getattr(module, name, None)
    if not callable(original):
        raise AttributeError(f"{module.__name__}.{name} is not a function on this build; the fault "
                             f"that patches it needs updating")
    replacement = make(original)
    for holder in _holders(name, original):
        setattr(holder, name, replacement)
    try:
        yield
    finally:
        for holder in _holders(name, replacement):
            setattr(holder, name, original)


@contextlib.contextmanager
def replace_default(module: ModuleType, name: str, change: Callable[[Any], Any]) -> Iterator[None]:
    """Make the default factory `module.name` (a policy's default, which an engine built without
    one asks) return `change(default)` for the duration, wherever it is bound."""
    def make(factory: Callable[[], Any]) -> Callable[[], Any]:
        def planted() -> Any:
            return change(factory())
        return planted

    with replace_function(module, name, make):
        yield


@contextlib.contextmanager
def replace_method(cls: type, name: str, make: Callable[[Callable], Callable]) -> Iterator[None]:
    """Set `cls.name` to `make(original)` for the duration (instances see it at once)."""
    original = cls.__dict__.get(name)
    if original is None:
        raise AttributeError(f"{cls.__qualname__}.{name} is not defined on this build; the fault "
                             f"that patches it needs updating")
    setattr(cls, name, make(original))
    try:
        yield
    finally:
        setattr(cls, name, original)
