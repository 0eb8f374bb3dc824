"""A function of a test module run in a fresh process of its own, for cases that leave CUDA's
process state broken behind them: a real capture invalidated by a refused host sync leaves the
default generator in capture state, so every later random op of the same process (an xdist worker
runs hundreds of tests) fails with "Offset increment outside graph capture encountered
unexpectedly". The process is forked from a forkserver that imported torch but never initialized
CUDA, so it pays for CUDA's start, not torch's import."""

from __future__ import annotations

import importlib.util
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["torch"])


def _call(path: str, function: str, args: tuple) -> Any:
    spec = importlib.util.spec_from_file_location(f"own_process_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it is made
    spec.loader.exec_module(module)
    return getattr(module, function)(*args)


def in_a_process_of_its_own(path: str | Path, function: str, *args: Any, timeout_s: float = 300) -> Any:
    """`function(*args)` of the module at `path`, in a new process; its (picklable) result, or
    its exception raised here."""
    with ProcessPoolExecutor(max_workers=1, mp_context=_CONTEXT) as pool:
        return pool.submit(_call, str(path), function, args).result(timeout=timeout_s)
