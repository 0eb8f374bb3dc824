"""What the doors to private names (torch_internals.py, triton_internals.py) report of a release:
for each name, missing or not behaving as the harness uses it."""

from __future__ import annotations

from typing import Any, Callable, Iterable


def findings(entries: Iterable[Any], obtain: Callable[[Any], Any],
             optional: Callable[[Any], bool] = lambda entry: False) -> list[str]:
    """One line per entry (with `path` and `probe`) that `obtain` cannot find, unless `optional`,
    or whose probe does not return True: `path (missing: ...)`, `path (does not behave: ...)`."""
    found = []
    for entry in entries:
        try:
            obj = obtain(entry)
        except (AttributeError, ImportError) as error:
            if not optional(entry):
                found.append(f"{entry.path} (missing: {error})")
            continue
        try:
            behaves = entry.probe(obj)
        except Exception as error:  # noqa: BLE001 (any failure of a probe is the finding)
            behaves, detail = False, f"{type(error).__name__}: {error}"
        else:
            detail = f"probe {getattr(entry.probe, '__name__', 'check')} returned {behaves!r}"
        if behaves is not True:
            found.append(f"{entry.path} (does not behave: {detail})")
    return found


__all__ = ["findings"]
