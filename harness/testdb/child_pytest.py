"""What a pytest process the harness starts (`harness run`, `harness repro`, the fault zoo's
sessions, the coverage check's collection) needs on its command line to load the harness's plugin.

pytest loads the plugin through the `pytest11` entry point of an installed harness. A harness used
from a checkout on PYTHONPATH has no entry point, and an environment with
PYTEST_DISABLE_PLUGIN_AUTOLOAD set loads none: there the child pytest refused the harness's own
options ("unrecognized arguments: --emulate-cuda", seen on a GPU machine whose image has no entry
point for it), so `harness repro --emulate-cuda` could not replay anything. Such a child gets
`-p harness.pytest_plugin`; one that loads the plugin by itself gets nothing, since pytest refuses
a plugin registered twice.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
from typing import Mapping

PLUGIN = "harness.pytest_plugin"


@functools.lru_cache(maxsize=1)
def _has_entry_point() -> bool:
    return any(entry.value == PLUGIN for entry in importlib.metadata.entry_points(group="pytest11"))


def plugin_arguments(env: Mapping[str, str] | None = None) -> list[str]:
    """`["-p", "harness.pytest_plugin"]` where a pytest process run with `env` (default: this
    process's environment) would not load the plugin by itself, else `[]`."""
    environ = os.environ if env is None else env
    if environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD") or not _has_entry_point():
        return ["-p", PLUGIN]
    return []


__all__ = ["PLUGIN", "plugin_arguments"]
