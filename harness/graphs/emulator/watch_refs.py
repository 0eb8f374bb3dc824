"""The harness's weak references on tensor objects a capture met, and swaps past them.

Both graph backends watch every tensor object a capture read or wrote (`WatchRef`), to tell at the
next replay that the object now shows other memory (storage_changes.py). torch's
`torch.utils.swap_tensors` refuses any tensor with a weak reference ("Cannot swap t1 because it has
weakref associated with it"), so a correct runtime that swaps captured parameters
(`module.to()` with `torch.__future__.set_swap_module_params_on_conversion(True)`) and then
recaptures was stopped at the swap by the harness's own references, where CUDA swaps. Once the
harness makes its first watch, `torch.utils.swap_tensors` is one that swaps past the harness's
references, and only those: a tensor with any other weak reference is refused by torch as before,
and every other swap is torch's. A swapped captured object shows other memory, so the next replay
of a graph that met it is refused with `StorageChangedError`, naming the capture's line.

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

_MARK = "_harness_swaps_past_watches"


class WatchRef(weakref.ref):
    """A weak reference the harness holds on a tensor object a capture met. Its own class, so
    that a swap of the object can tell it from a program's own."""

    __slots__ = ()

    def __init__(self, obj: Any, callback: Callable | None = None) -> None:
        super().__init__(obj, callback)
        if not getattr(torch.utils.swap_tensors, _MARK, False):
            install_swaps_past_watches()


def _weakrefs_without_watches(obj: Any) -> list:
    return [ref for ref in weakref.getweakrefs(obj) if not isinstance(ref, WatchRef)]


_WITHOUT_WATCHES = types.SimpleNamespace(getweakrefs=_weakrefs_without_watches)


def swap_past_watches(original: Callable[[torch.Tensor, torch.Tensor], None]) -> Callable:
    """`original` (torch's swap_tensors), made to see no weak reference of the harness's."""
    module = sys.modules.get(getattr(original, "__module__", ""), None)

    @functools.wraps(original)
    def swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
        refs = [*weakref.getweakrefs(t1), *weakref.getweakrefs(t2)]
        if not refs or not all(isinstance(ref, WatchRef) for ref in refs) \
                or getattr(module, "weakref", None) is not weakref:
            return original(t1, t2)
        module.weakref = _WITHOUT_WATCHES
        try:
            return original(t1, t2)
        finally:
            module.weakref = weakref

    setattr(swap_tensors, _MARK, True)
    return swap_tensors


def install_swaps_past_watches() -> Callable:
    """Make `torch.utils.swap_tensors` swap past the harness's references (once for the process;
    the emulated CUDA device's table finds it in place and keeps it). Returns it."""
    current = torch.utils.swap_tensors
    if not getattr(current, _MARK, False):
        current = torch.utils.swap_tensors = swap_past_watches(current)
    return current


__all__ = ["WatchRef", "install_swaps_past_watches", "swap_past_watches"]
