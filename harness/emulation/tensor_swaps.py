"""`torch.utils.swap_tensors` on a tensor a capture met, as CUDA lets it happen.

torch refuses to swap a tensor that has weak references. The harness holds one on every tensor
object a capture read or wrote (`WatchRef`, graphs/emulator/storage_changes.py), so on the emulated
device a runtime that swaps captured parameters (`module.to()` with
`torch.__future__.set_swap_module_params_on_conversion(True)`, `load_state_dict(assign=True)`)
stopped at the swap with torch's "has weakref associated with it", where CUDA swaps silently and
the graph keeps reading the old memory. The replacement swaps past the harness's own references,
and only those: a tensor with any other weak reference is refused by torch as before. The captured
object now shows other memory, so the next replay is refused with `StorageChangedError`, naming the
capture's line (as for `set_` and `.data = ...`).

torch's `swap_tensors` reads `weakref.getweakrefs` through its module's global `weakref`; the
replacement hands it one that leaves the harness's references out for the call. A torch whose
`swap_tensors` finds weak references another way keeps refusing, as it did.
"""

from __future__ import annotations

import functools
import sys
import types
import weakref
from typing import Any, Callable

import torch

from harness.graphs.emulator.storage_changes import WatchRef


def _only_watches(refs: list) -> bool:
    return all(isinstance(ref, WatchRef) for ref in refs)


def _weakrefs_without_watches(obj: Any) -> list:
    return [ref for ref in weakref.getweakrefs(obj) if not isinstance(ref, WatchRef)]


_WITHOUT_WATCHES = types.SimpleNamespace(getweakrefs=_weakrefs_without_watches)


def swap_past_watches(original: Callable[[torch.Tensor, torch.Tensor], None]) -> Callable:
    module = sys.modules.get(getattr(original, "__module__", ""), None)

    @functools.wraps(original)
    def swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
        refs = [*weakref.getweakrefs(t1), *weakref.getweakrefs(t2)]
        if not refs or not _only_watches(refs) or getattr(module, "weakref", None) is not weakref:
            return original(t1, t2)
        module.weakref = _WITHOUT_WATCHES
        try:
            return original(t1, t2)
        finally:
            module.weakref = weakref

    return swap_tensors


def swap_tensors_past_watches(state) -> Callable:
    """The replacement of `torch.utils.swap_tensors` (a `value` row of cuda_api's table)."""
    return swap_past_watches(torch.utils.swap_tensors)
