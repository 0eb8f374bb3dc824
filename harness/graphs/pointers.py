"""What a captured graph baked in: the address, shape and dtype of every tensor reachable from an object.

A graph replays against the storages it saw at capture. Code that later rebinds an attribute to a new
tensor (or regrows a buffer) leaves the graph reading the old storage, silently. `snapshot_tensors` records
every tensor reachable from an object by a readable path (`metadata.block_tables`, `layers[0].cache`,
`extra['ws']`); `moved_tensors` compares two snapshots and names what changed.

The walk follows every path, not just the first one that reaches an object: two attributes sharing one
tensor are both recorded, so rebinding either of them is caught. Cycles are cut at the object already on
the current path.

The walk enters what a runtime owns, including its own `_private` attributes (a runtime's `self._workspace`
is what gets rebound), but not the private state of torch's and the harness's machinery: a
`torch.cuda.CUDAGraph` under the emulation holds the device, its caching allocator and its block chain,
which alias what the runtime holds and nest deeper than any runtime. Those attributes and any path nested
deeper than `max_depth` are skipped and listed in the snapshot's `paths_not_walked`; a correct runtime
never makes the walk raise.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import weakref
from collections.abc import Mapping
from typing import Any, Callable

import numpy
import torch
from torch import nn

_REMEDY = "copy into the captured buffer with `.copy_()` instead of rebinding it"

# Leaves that can never hold a tensor; skipping them keeps the walk cheap on large host-side structures.
_ATOMS = (
    str, bytes, bytearray, int, float, complex, bool, type(None), enum.Enum, range, set, frozenset,
    torch.dtype, torch.device, torch.Size, torch.memory_format, torch.layout,
    type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
)

# Packages whose objects' `_private` attributes are machinery, not state a runtime owns.
_MACHINERY_PACKAGES = ("torch", "harness.emulation", "harness.graphs")

# nn.Module's own bookkeeping (hooks, flags); parameters, buffers and submodules are walked by name instead.
_MODULE_INTERNALS = frozenset(vars(nn.Module()))


@dataclasses.dataclass(frozen=True)
class TensorRecord:
    """Where a tensor's data lived when it was recorded: the byte address of its first element."""

    address: int
    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorRecord:
        return cls(address=_address(tensor), shape=tuple(tensor.shape), dtype=str(tensor.dtype))

    def __str__(self) -> str:
        return f"{self.address:#x} {list(self.shape)} {self.dtype}"


class TensorSnapshot(dict):
    """`snapshot_tensors`' result: path -> TensorRecord, and `paths_not_walked`, the paths the walk
    skipped (machinery's private state, structures nested deeper than `max_depth`)."""

    def __init__(self, records: Mapping[str, Any], paths_not_walked: tuple[str, ...]) -> None:
        super().__init__(records)
        self._paths_not_walked = paths_not_walked

    @property
    def paths_not_walked(self) -> tuple[str, ...]:
        return self._paths_not_walked


def snapshot_tensors(obj: Any, root: str = "", *, max_depth: int = 64) -> TensorSnapshot:
    """Record every tensor reachable from `obj`, keyed by its path from `obj` (prefixed with `root`).

    Walks tensors, nn.Modules (parameters, buffers, submodules and plain attributes), dicts, lists,
    tuples (namedtuple fields by name), and any object's `__dict__` and `__slots__` (dataclasses
    included). Sets, callables and objects with neither `__dict__` nor `__slots__` are not entered,
    nor the `_private` attributes of torch's and the harness's own objects (a CUDAGraph, a stream);
    those and the paths nested deeper than `max_depth` are listed in `paths_not_walked`.
    """
    records: dict[str, TensorRecord] = {}
    skipped: list[str] = []
    _walk(obj, root, records, on_path=set(), depth=0, max_depth=max_depth, leaf=TensorRecord.of,
          too_deep=skipped)
    return TensorSnapshot(records, tuple(skipped))


def tensor_refs(obj: Any, root: str = "", *, max_depth: int = 64) -> dict[str, weakref.ref]:
    """A weak reference to every tensor reachable from `obj`, by the paths of `snapshot_tensors`
    (with the same paths skipped).

    Addresses alone miss a rebinding whose new tensor landed at the freed old one's address (the
    allocator reuses it at once); the tensor objects do not: compare with `rebound_tensors`."""
    refs: dict[str, weakref.ref] = {}
    _walk(obj, root, refs, on_path=set(), depth=0, max_depth=max_depth, leaf=weakref.ref,
          too_deep=[])
    return refs


@dataclasses.dataclass(frozen=True)
class PublicTensors:
    """The tensors reachable from an object by public paths (weak references, by path), and the
    paths the walk did not enter because they are nested deeper than its `max_depth`."""

    refs: Mapping[str, weakref.ref]
    too_deep: tuple[str, ...]


def public_tensor_refs(obj: Any, root: str = "", *, max_depth: int = 64) -> PublicTensors:
    """`tensor_refs` for naming tensors in a report: attributes whose names start with `_` are not
    entered (an object's machinery, such as an emulated CUDAGraph's device state, aliases what it
    holds and can be arbitrarily deep), and a path nested deeper than `max_depth` is listed in
    `too_deep` and skipped while the rest of the walk goes on."""
    refs: dict[str, weakref.ref] = {}
    too_deep: list[str] = []
    _walk(obj, root, refs, on_path=set(), depth=0, max_depth=max_depth, leaf=weakref.ref,
          too_deep=too_deep, public=True)
    return PublicTensors(refs, tuple(too_deep))


def rebound_tensors(before: Mapping[str, weakref.ref], after: Mapping[str, weakref.ref]) -> list[str]:
    """Paths of `before` that now hold another tensor object (or none), whatever its address."""
    return [path for path, ref in before.items()
            if ref() is None or path not in after or after[path]() is not ref()]


def moved_tensors(before: Mapping[str, TensorRecord], after: Mapping[str, TensorRecord]) -> list[str]:
    """Paths of `before` whose address, shape or dtype differ in `after`, or that vanished from it.

    Paths that only appear in `after` are not reported: no graph captured before can have read them.
    """
    return [path for path, record in before.items() if after.get(path) != record]


def describe_moved_tensor(path: str, before: TensorRecord, after: TensorRecord | None) -> str:
    """One line about a moved tensor, in the spirit of PyTorch's cudagraph_trees data-pointer check."""
    if after is None:
        change = f"vanished (was {before})"
    else:
        parts = []
        if after.address != before.address:
            parts.append(f"data pointer changed from {before.address:#x} to {after.address:#x}")
        if after.shape != before.shape:
            parts.append(f"shape changed from {list(before.shape)} to {list(after.shape)}")
        if after.dtype != before.dtype:
            parts.append(f"dtype changed from {before.dtype} to {after.dtype}")
        change = "; ".join(parts) or "unchanged"
    return f"{path}: {change}. A captured graph still uses the old tensor: {_REMEDY}."


def describe_moved(before: Mapping[str, TensorRecord], after: Mapping[str, TensorRecord]) -> str:
    """A report of every moved tensor, one line each; empty when nothing moved."""
    return "\n".join(describe_moved_tensor(p, before[p], after.get(p)) for p in moved_tensors(before, after))


def _address(tensor: torch.Tensor) -> int:
    try:
        return tensor.data_ptr()
    except RuntimeError:
        # Tensors without data (fake, some subclasses) still have a storage identity to compare.
        storage = tensor.untyped_storage()
        return storage.data_ptr() + tensor.storage_offset() * tensor.element_size()


def _walk(obj: Any, path: str, out: dict[str, Any], *, on_path: set[int], depth: int,
          max_depth: int, leaf: Callable[[torch.Tensor], Any], too_deep: list[str] | None = None,
          public: bool = False) -> None:
    """With `too_deep` a list, a path nested deeper than `max_depth` (or a machinery attribute
    skipped) is appended to it and not entered; without, a path too deep raises. With `public`, attributes named `_...` are not entered."""
    if isinstance(obj, torch.Tensor):
        out[path] = leaf(obj)
        return
    if obj is _NOT_WALKED:
        if too_deep is not None:
            too_deep.append(path)
        return
    if _is_atom(type(obj)) or id(obj) in on_path or _holds_no_objects(obj):
        return
    if depth >= max_depth:
        if too_deep is None:
            raise ValueError(f"snapshot_tensors: {path or '<root>'} is nested deeper than max_depth={max_depth}")
        too_deep.append(path or "<root>")
        return
    on_path.add(id(obj))
    try:
        for child_path, child in _children(obj, path, public):
            # Tensors are most children (`_children` leaves atoms out): settled here, without a call.
            if isinstance(child, torch.Tensor):
                out[child_path] = leaf(child)
            elif not _holds_no_objects(child):
                _walk(child, child_path, out, on_path=on_path, depth=depth + 1, max_depth=max_depth,
                      leaf=leaf, too_deep=too_deep, public=public)
    finally:
        on_path.discard(id(obj))


@functools.lru_cache(maxsize=1024)  # per type: isinstance against the whole tuple costs a microsecond
def _is_atom(cls: type) -> bool:
    return issubclass(cls, _ATOMS)


def _holds_no_objects(obj: Any) -> bool:
    """A numpy array of numbers (a runtime's host-side staging views): nothing in it to walk."""
    return isinstance(obj, numpy.ndarray) and not obj.dtype.hasobject


def _children(obj: Any, path: str, public: bool = False):
    """(path, child) of every child that can hold a tensor: atoms are left out before their path
    is written."""
    if isinstance(obj, nn.Module):
        for child_path, value in _module_children(obj, path, public):
            if not _is_atom(type(value)):
                yield child_path, value
    elif isinstance(obj, Mapping):
        for key, value in list(obj.items()):
            if not _is_atom(type(value)):
                yield f"{path}[{key!r}]", value
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        for name, value in zip(obj._fields, obj):
            if not _is_atom(type(value)):
                yield _attr(path, name), value
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(list(obj)):
            if not _is_atom(type(value)):
                yield f"{path}[{i}]", value
    else:
        machinery = _is_machinery(obj)
        for name, value in _attributes(obj):
            if _is_atom(type(value)):
                continue
            if not ((public or machinery) and name.startswith("_")):
                yield _attr(path, name), value
            elif machinery and not public:
                yield _attr(path, name), _NOT_WALKED


def _is_machinery(obj: Any) -> bool:
    return _is_machinery_type(type(obj))


@functools.lru_cache(maxsize=1024)  # a snapshot asks once per object walked, of a few types
def _is_machinery_type(cls: type) -> bool:
    module = getattr(cls, "__module__", "") or ""
    return any(module == p or module.startswith(p + ".") for p in _MACHINERY_PACKAGES)


class _NotWalked:
    """Stands for a machinery attribute the walk skipped, so that its path is listed."""


_NOT_WALKED = _NotWalked()


def _module_children(module: nn.Module, path: str, public: bool):
    # Parameters, buffers and submodules live in private dicts; give them the paths users write.
    for name, value in module._parameters.items():
        yield _attr(path, name), value
    for name, value in module._buffers.items():
        yield _attr(path, name), value
    for name, child in module._modules.items():
        yield (f"{path}[{name}]" if name.isdigit() else _attr(path, name)), child
    for name, value in vars(module).items():
        if name not in _MODULE_INTERNALS and not (public and name.startswith("_")):
            yield _attr(path, name), value


def _attributes(obj: Any):
    attributes = getattr(obj, "__dict__", {})
    yield from attributes.items()
    for name, stored in _slots(type(obj)):
        if name in attributes:
            continue
        try:
            yield name, object.__getattribute__(obj, stored)
        except AttributeError:
            continue  # an unset slot holds nothing


@functools.lru_cache(maxsize=1024)
def _slots(cls: type) -> tuple[tuple[str, str], ...]:
    """(name, stored name) of every slot `cls` and its bases declare, first declaration first (a
    private `__name` is stored under its mangled name)."""
    seen: set[str] = set()
    slots = []
    for base in cls.__mro__:
        declared = base.__dict__.get("__slots__", ())
        for name in (declared,) if isinstance(declared, str) else declared:
            if name in seen or name in ("__dict__", "__weakref__"):
                continue
            seen.add(name)
            private = name.startswith("__") and not name.endswith("__")
            slots.append((name, f"_{base.__name__.lstrip('_')}{name}" if private else name))
    return tuple(slots)


def _attr(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
