"""The adversarial schedule's per-op costs, kept off torch's Python paths: a queued op's result
shapes by its arguments' metadata (its meta kernel runs through torch's Python refs, about half of
a queued op's cost), and tensor maps over aten's own argument and result containers (torch's
pytree is the other large part).

A meta kernel sees only each tensor's size, stride and dtype (`shapes.to_meta`) and the other
arguments' values, so results for the same op and the same of those are the same: the key holds
exactly them. An argument of another kind (a generator, a SymInt, an object) makes the call
uncacheable, and it runs the meta kernel as before.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from harness.torch_internals import tree_flatten, tree_map_only
from harness.graphs.emulator.shapes import result_shapes

_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format,
          torch.layout)
_UNCACHEABLE = object()


def _key_of(value: Any) -> Any:
    kind = type(value)
    if kind is torch.Tensor or isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            return _UNCACHEABLE
        return (value.shape, value.stride(), value.dtype)
    if kind is list or kind is tuple or kind is torch.Size:
        items = tuple(_key_of(v) for v in value)
        return _UNCACHEABLE if _UNCACHEABLE in items else (kind, items)
    if kind in _PLAIN:
        return (kind, value)  # the kind too: True, 1 and 1.0 are one key otherwise
    return _UNCACHEABLE


class ResultShapes:
    """`result_shapes(func, args, kwargs)`, kept per op and argument metadata. The meta tensors
    returned are shared between calls: callers read their size, stride and dtype only."""

    BOUND = 4096  # distinct calls kept; past it the cache starts again

    def __init__(self) -> None:
        self._known: dict[tuple, Any] = {}

    def of(self, func, args: tuple, kwargs: dict) -> Any:
        key = (func, _key_of(args), _key_of(tuple(kwargs.items())) if kwargs else None)
        if _UNCACHEABLE in key:
            return result_shapes(func, args, kwargs)
        known = self._known
        if key in known:
            return known[key]
        shapes = result_shapes(func, args, kwargs)
        if len(known) >= self.BOUND:
            known.clear()
        known[key] = shapes
        return shapes


def map_tensors(fn: Callable[[torch.Tensor], Any], value: Any) -> Any:
    """`value` with each tensor replaced by `fn(tensor)`: plain tuples, lists and dicts (aten's
    arguments nest at most a list deep) without torch's pytree; anything else through it."""
    kind = type(value)
    if isinstance(value, torch.Tensor):
        return fn(value)
    if kind is tuple:  # a list made first: tuple() of a generator is slower, and every queued op
        return tuple([map_tensors(fn, v) for v in value])  # maps its arguments twice
    if kind is list:
        return [map_tensors(fn, v) for v in value]
    if kind is dict:
        return {k: map_tensors(fn, v) for k, v in value.items()}
    if kind in _PLAIN:
        return value
    return tree_map_only(torch.Tensor, fn, value)


def flat_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in an op's result, in order (a tensor, a plain tuple or list of them, or any
    other result through torch's pytree)."""
    if isinstance(value, torch.Tensor):
        return [value]
    kind = type(value)
    if kind is tuple or kind is list:
        out = []
        for v in value:
            out.extend(flat_tensors(v))
        return out
    if kind in _PLAIN:
        return []
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
