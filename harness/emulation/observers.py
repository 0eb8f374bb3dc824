"""The observer interface shared by the emulated device's state and the graph sanitizer's host:
observers (stream tracking, the explainer) registered for a while, and hooks called by name."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


class Observed:
    """Holds `self.observers` (a list its subclass makes); calls each observer's hook by name."""

    observers: list[Any]

    @contextlib.contextmanager
    def observe(self, observer: Any) -> Iterator[Any]:
        """Register `observer` for the duration."""
        self.observers.append(observer)
        try:
            yield observer
        finally:
            self.observers.remove(observer)

    def _tell(self, method: str, *args) -> None:
        for observer in tuple(self.observers):
            hook = getattr(observer, method, None)
            if hook is not None:
                hook(*args)
