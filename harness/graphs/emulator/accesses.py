"""What a device op reads and writes, by storage, and whether it makes the host wait.

Written: the arguments the schema marks written (`Tensor(a!)`); read: every other tensor argument
on the device, and pinned host tensors (a `non_blocking` copy reads or writes them when its stream
gets to it). A pageable host tensor is read when the op is issued (a 0-dim host tensor is passed by
value; a pageable copy is staged synchronously), so it is no stream's access.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from harness import torch_internals
from harness.graphs.emulator import opinfo

aten = torch.ops.aten
COPIES = frozenset({aten.copy_.default, aten._to_copy.default, aten.copy.default})


@functools.lru_cache(maxsize=None)
def _written_names(func) -> frozenset[str]:
    return frozenset(a.name for a in func._schema.arguments
                     if a.alias_info is not None and a.alias_info.is_write)


SPARSE_LAYOUTS = frozenset({torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr,
                            torch.sparse_bsc})


def sparse_parts(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The dense tensors a sparse tensor is made of, its values first (COO: values, indices; the
    compressed layouts: values, compressed and plain indices), read with torch function and
    dispatch modes off; () for one whose parts cannot be read (fake or meta)."""
    try:
        with torch_internals.DisableTorchFunction(), torch_internals.DisableTorchDispatch():
            if t.layout is torch.sparse_coo:
                return t._values(), t._indices()
            if t.layout in (torch.sparse_csr, torch.sparse_bsr):
                return t.values(), t.crow_indices(), t.col_indices()
            return t.values(), t.ccol_indices(), t.row_indices()
    except (RuntimeError, NotImplementedError, TypeError):
        return ()


def tensors_of(values) -> list[torch.Tensor]:
    """The tensors among an op's argument values (aten arguments nest at most a list deep); a
    sparse tensor's accesses are those of its parts (`sparse_parts`)."""
    out = []
    for value in values:
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out.extend(v for v in value if isinstance(v, torch.Tensor))
    if any(t.layout in SPARSE_LAYOUTS for t in out):
        out = [p for t in out for p in (sparse_parts(t) if t.layout in SPARSE_LAYOUTS else (t,))]
    return out


def higher_order_tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors a higher-order operator is given, at any depth (its operands nest in tuples and
    dicts, beside the graphs it runs)."""
    leaves, _ = torch_internals.tree_flatten((args, kwargs))
    return [x for x in leaves if isinstance(x, torch.Tensor)]


def split_accesses(func, args: tuple, kwargs: dict, tracked: Callable[[torch.Tensor], bool]
                   ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(read, written) tensors among the op's arguments that `tracked` accepts."""
    written_names = _written_names(func)
    if not written_names:
        reads = [t for t in tensors_of((*args, *kwargs.values())) if tracked(t)]
        return reads, []
    reads, writes = [], []
    for name, value in opinfo.bind(func, args, kwargs, defaults=False).items():
        into = writes if name in written_names else reads
        into.extend(t for t in tensors_of((value,)) if tracked(t))
    return reads, writes


def blocks_host(func, args: tuple, kwargs: dict, is_device: Callable[[torch.Tensor], bool],
                is_pinned: Callable[[torch.Tensor], bool], targets_device: bool) -> bool:
    """Whether the host waits for the stream when it issues this op: a data-dependent result
    (`.item()`, `nonzero`), or a copy between host and device that is not `non_blocking` from or
    into pinned memory."""
    if func in COPIES:
        return copy_blocks_host(func, args, kwargs, is_device, is_pinned, targets_device)
    if opinfo.sync_reason(func, args, kwargs, is_device) is not None:
        return True
    if opinfo.reads_a_device_value(func, args, kwargs, is_device) is not None:
        return True  # masked_fill's `value.item()` inside CUDA's kernel
    if opinfo.copies_to_host_inside(func) and opinfo.kernel_host_copy(func, args, kwargs) is not None:
        return True  # matrix_exp's norms, copied inside CUDA's kernel
    return _returns_host_value(func)  # `torch.equal`, `is_nonzero`: a value computed from the data


def copy_blocks_host(func, args: tuple, kwargs: dict, is_device: Callable[[torch.Tensor], bool],
                     is_pinned: Callable[[torch.Tensor], bool], targets_device: bool) -> bool:
    """`blocks_host` for the copies (`COPIES`), from their arguments as aten passes them: a
    schema bind per copy was a tenth of the stream tracking's cost in a decode step."""
    if func is aten._to_copy.default:  # every argument but `self` is keyword-only
        # The placement mode rewrote the device to the cpu: the call says where it lands.
        src = args[0] if args else kwargs["self"]
        crosses = kwargs.get("device") is not None and is_device(src) != targets_device
        return crosses and not (kwargs.get("non_blocking") and is_pinned(src))
    dst = args[0] if args else kwargs["self"]
    src = args[1] if len(args) > 1 else kwargs["src"]
    non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    host = [t for t in (dst, src) if not is_device(t)]
    if not host or len(host) == 2:
        return False
    return not (non_blocking and is_pinned(host[0]))


@functools.lru_cache(maxsize=None)
def may_block_host(func) -> bool:
    """Whether `blocks_host` can answer True for some arguments of this op (asked once per op)."""
    return (func in COPIES or _returns_host_value(func) or opinfo.may_sync(func)
            or opinfo.copies_to_host_inside(func))


def written_names(func) -> frozenset[str]:
    """The op's arguments its schema marks written (`Tensor(a!)`)."""
    return _written_names(func)


@functools.lru_cache(maxsize=None)
def _returns_host_value(func) -> bool:
    returns = func._schema.returns
    return bool(returns) and not any("Tensor" in str(r.type) for r in returns)


_REALLOCATING = frozenset({"resize_", "resize_as_", "set_", "_resize_output_"})
_RESIZING = _REALLOCATING - {"set_"}


@functools.lru_cache(maxsize=None)
def changes_metadata(func) -> bool:
    """Ops that change a tensor's shape or memory on the host (`resize_`, `set_`, `t_`): the
    allocator or the tensor's metadata acts when they are issued, never later."""
    return (torch.Tag.inplace_view in func.tags
            or func._schema.name.split("::")[-1] in _REALLOCATING)


@functools.lru_cache(maxsize=None)
def only_metadata(func) -> bool:
    """Ops that change nothing but a tensor's shape, strides or storage on the host (`set_`,
    `unsqueeze_`, `t_`, `as_strided_`): CUDA launches nothing for them, so a capture runs them when
    it meets them and its graph has no node of theirs. `resize_` is tagged so too, but growing
    a tensor allocates and copies: it stays with the capture's checks."""
    name = func._schema.name.split("::")[-1]
    return name == "set_" or (torch.Tag.inplace_view in func.tags and name not in _RESIZING)


def is_seeded(func) -> bool:
    """Random ops take their generator offset when issued: they must not be reordered."""
    return torch.Tag.nondeterministic_seeded in func.tags
