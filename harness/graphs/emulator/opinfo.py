"""What the emulator needs to know about an aten or custom op, read from its schema and tags:
how it aliases, whether capture may record it, and the allocation-free call that replays it."""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch

from harness import torch_internals
from harness.graphs.emulator import cuda_errors

aten = torch.ops.aten

# Factory arguments that an `out=` overload takes from its `out` tensor instead.
_FACTORY_KWARGS = frozenset({"dtype", "layout", "device", "pin_memory", "memory_format"})

# `index.Tensor` is tagged dynamic because of boolean masks; integer indices are capturable.
_MASKABLE = frozenset({aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                       aten._index_put_impl_.default})

# Schemas claim a fresh result, but the kernel returns a view of its input.
_HIDDEN_VIEWS = frozenset({aten._unsafe_view.default})


class OpKind(enum.Enum):
    VIEW = "view"            # aliases an input: run for real at capture, nothing to replay
    MUTATING = "mutating"    # in-place or out=: every return aliases a mutated argument
    FUNCTIONAL = "functional"  # fresh results: allocated from the pool at capture
    MIXED = "mixed"          # mutates arguments and returns fresh results


def op_name(func: Any) -> str:
    """The name users recognise: `aten.add.Tensor`, `harness.paged_attention.default`."""
    return str(func)


@functools.lru_cache(maxsize=None)
def op_kind(func: torch_internals.OpOverload) -> OpKind:
    if func in _HIDDEN_VIEWS:
        return OpKind.VIEW
    schema = func._schema
    returns = schema.returns
    if any(r.alias_info is not None and not r.alias_info.is_write for r in returns):
        return OpKind.VIEW
    mutates = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    if all(r.alias_info is not None for r in returns) and (returns or mutates):
        return OpKind.MUTATING
    return OpKind.MIXED if mutates else OpKind.FUNCTIONAL


@functools.lru_cache(maxsize=None)
def is_composite(func: torch_internals.OpOverload) -> bool:
    """Ops that autograd normally decomposes; under inference mode they reach the recorder whole,
    and their alias annotation only means "may alias" (`to`, `reshape`), so they are decomposed.
    An op the dispatcher does not hold (TorchScript's `prim::device`, which a fake tensor mode
    dispatches for `.device`) has no such kernel."""
    try:
        return torch_internals.dispatch_has_kernel_for_dispatch_key(func.name(),
                                                                   "CompositeImplicitAutograd")
    except RuntimeError as error:
        if "does not exist" not in str(error):
            raise
        return False


def bind(func: torch_internals.OpOverload, args: tuple, kwargs: dict, *,
         defaults: bool = True) -> dict[str, Any]:
    """Argument values by schema name, defaults filled in unless `defaults` is False."""
    named: dict[str, Any] = {}
    positional = iter(args)
    for name, kwarg_only, has_default, default in _arguments(func):
        if not kwarg_only:
            value = next(positional, _MISSING)
            if value is not _MISSING:
                named[name] = value
                continue
        if name in kwargs:
            named[name] = kwargs[name]
        elif defaults and has_default:
            named[name] = default
    return named


@functools.lru_cache(maxsize=None)
def _arguments(func: torch_internals.OpOverload) -> tuple[tuple[str, bool, bool, Any], ...]:
    # A schema's `arguments` builds new binding objects at every access: costly on the hot path.
    return tuple((a.name, a.kwarg_only, a.has_default_value(),
                  a.default_value if a.has_default_value() else None) for a in func._schema.arguments)


_MISSING = object()


def aliased_returns(func: torch_internals.OpOverload, args: tuple, kwargs: dict) -> Any:
    """What an in-place or out= op returns: the very argument objects its returns alias."""
    schema = func._schema
    if not schema.returns:
        return None
    named = bind(func, args, kwargs)
    by_set = {frozenset(a.alias_info.before_set): a.name
              for a in schema.arguments if a.alias_info is not None}
    values = tuple(named[by_set[frozenset(r.alias_info.before_set)]] for r in schema.returns)
    return values[0] if len(values) == 1 else values


def sync_reason(func: torch_internals.OpOverload, args: tuple, kwargs: dict,
                on_device: Callable[[torch.Tensor], bool] | None = None) -> str | None:
    """Why a graph cannot record this op (a host sync or a data-dependent shape), or None.
    `on_device` says which tensors are device memory (by default, every tensor not on the host
    device)."""
    packet = getattr(func, "overloadpacket", None)
    if packet in _SOLVER_CHECKS:
        return _solver_check_reason(packet, bind(func, args, kwargs))
    if packet in _CTC_LOSSES:
        return None  # tagged dynamic, but CUDA's kernel refuses first at its copy (copy_refusal)
    if packet in _BINCOUNTS and bind(func, args, kwargs)["self"].numel():
        return None  # tagged dynamic, but CUDA's kernel refuses first at its copy (copy_refusal)
    if packet is aten.repeat_interleave and bind(func, args, kwargs).get("output_size") is not None:
        return None  # the size given, CUDA's kernel reads no repeats on the host
    tags = func.tags
    if torch.Tag.data_dependent_output in tags:
        return "reads device data on the host (a sync)"
    if func in _MASKABLE:
        named = bind(func, args, kwargs)
        indices = named.get("indices") or ()
        if any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in indices) \
                and not _is_masked_fill(func, named, on_device or _on_device(None)):
            return "boolean-mask indexing has a data-dependent shape"
        return None
    if func is _GROUPED_MM:  # a copy to pageable memory (kernel_host_copy), a sync where
        return _grouped_mm_reason(bind(func, args, kwargs))  # no memory tells device from host
    if func in _ISINS:
        return _isin_reason(bind(func, args, kwargs))
    if func in _MODES:
        return _mode_reason(bind(func, args, kwargs))
    if packet in _TO_SPARSE and bind(func, args, kwargs)["self"].layout == torch.strided:
        return ("a dense tensor made sparse has as many entries as it has nonzeros, which CUDA's "
                "kernel counts with `nonzero()` and reads on the host (a sync); keep the dense "
                "tensor in the captured step, or convert before capture")
    if torch.Tag.dynamic_output_shape in tags:
        return "its output shape depends on device data"
    return None


@functools.lru_cache(maxsize=None)
def may_sync(func: torch_internals.OpOverload) -> bool:
    """Whether `sync_reason` can be other than None for some arguments of this op: the question
    asked once per op, so that the stream tracking calls `sync_reason` only for these."""
    tags = func.tags
    return (torch.Tag.data_dependent_output in tags or torch.Tag.dynamic_output_shape in tags
            or func in _MASKABLE or (_GROUPED_MM is not None and func is _GROUPED_MM)
            or func in _ISINS or func in _MODES
            or getattr(func, "overloadpacket", None) in _SOLVER_CHECKS | _TO_SPARSE)


def _packets(*names: str) -> frozenset:
    return frozenset(getattr(aten, name) for name in names if hasattr(aten, name))


# A dense tensor made sparse (SparseTensor.cpp's dense_to_sparse, the compressed layouts' kernels
# alike): the number of entries is the number of nonzeros, counted by `nonzero()`, whose size the
# host reads. The ops' tags say nothing of it, and the device's dispatch sees them whole.
_TO_SPARSE = _packets("_to_sparse", "_to_sparse_csr", "_to_sparse_csc", "_to_sparse_bsr",
                      "_to_sparse_bsc")


# CUDA's solvers raise on a failed factorization (a singular matrix, one not positive-definite)
# after reading their info codes on the host: `_linalg_check_errors` calls `infos.any().item()`,
# a copy to the host and a stream sync. The checking ops (`linalg.inv`, `cholesky`, `solve`,
# `lu_factor`, `ldl_factor` call it after their `_ex` op) and the kernels that call it inside
# (`_linalg_eigh`, `linalg_eig`, `cholesky_inverse`, the deprecated `cholesky`, and the `_ex` ops
# given check_errors=True) reach the device's dispatch whole, the read inside them unseen, and the
# CPU's kernels read host memory; their tags say nothing of it (PyTorch #96632). In a capture,
# cuSOLVER's eigensolvers fail before that read (`solver_failure_in_capture`), and the SVD (with
# `pinv` and the spectral norm through it) meets Copy.cu's refusal first (`kernel_host_copy`),
# as measured on an H100 (torch 2.11). `cholesky_solve` is not one: only its CPU kernel checks
# (CUDA's cuSOLVER path asserts in debug builds only).
_ALWAYS_CHECKED = _packets("_linalg_check_errors", "_linalg_eigh", "linalg_eig",
                           "cholesky_inverse", "cholesky")
_CHECKED_ON_REQUEST = _packets("linalg_cholesky_ex", "linalg_inv_ex", "linalg_lu_factor_ex",
                               "linalg_ldl_factor_ex", "_linalg_solve_ex", "linalg_solve_ex")
_SOLVER_CHECKS = _ALWAYS_CHECKED | _CHECKED_ON_REQUEST


def _solver_check_reason(packet, named: dict) -> str | None:
    if packet in _CHECKED_ON_REQUEST and not named.get("check_errors"):
        return None
    name = packet.__name__.split(".")[-1]
    return (f"CUDA's solver reads its info codes on the host to raise on a failed factorization "
            f"(`_linalg_check_errors`, under {name}: `infos.any().item()`, a sync); call the `_ex` "
            f"op with check_errors=False (`torch.linalg.solve_ex`, `inv_ex`, `cholesky_ex`, "
            f"`lu_factor_ex`) and check its `info` after the replay")


# cuSOLVER's eigensolvers fail inside a capture before any info code is read (measured on an H100,
# torch 2.11): `_linalg_eigh` (eigh, eigvalsh) at `cusolverDnXsyevd`, `linalg_eig` (eig, eigvals)
# at `cusolverDnXgeev_bufferSize`, each CUSOLVER_STATUS_INTERNAL_ERROR, and the capture is
# invalidated.
_CUSOLVER_FAILURES = {packet: text for packet, text in (
    (getattr(aten, "_linalg_eigh", None), cuda_errors.CUSOLVER_SYEVD_FAILED),
    (getattr(aten, "linalg_eig", None), cuda_errors.CUSOLVER_GEEV_FAILED)) if packet is not None}


def _kernel_met(func: Any, args: tuple, kwargs: dict) -> Any:
    """The op packet whose CUDA kernel this op's rules are those of: `linalg_pinv` reaches the
    device's dispatch whole and runs the SVD, or eigh given hermitian=True; any other op its own."""
    packet = getattr(func, "overloadpacket", None)
    if packet is None or packet is not getattr(aten, "linalg_pinv", None):
        return packet
    return aten._linalg_eigh if bind(func, args, kwargs).get("hermitian") else aten._linalg_svd


def solver_failure_in_capture(func: torch_internals.OpOverload, args: tuple,
                              kwargs: dict) -> str | None:
    """CUDA's text when cuSOLVER fails inside a capture on this op (the capture invalidated behind
    it), or None."""
    return _CUSOLVER_FAILURES.get(_kernel_met(func, args, kwargs))


@dataclass(frozen=True)
class CaptureRefusal:
    """What CUDA raises for an op in a capture: its text, why (the harness's words, with what to
    do instead) and whether the capture is invalidated behind it (a refused sync or a failed CUDA
    call; Copy.cu refuses a pageable copy before it enqueues anything, the capture still valid)."""

    cuda_text: str
    why: str
    invalidates: bool


def capture_refusal(func: torch_internals.OpOverload, args: tuple, kwargs: dict,
                    device: torch.device | None, memory: Any = None) -> CaptureRefusal | None:
    """The first refusal CUDA meets for this op in a capture, in the order its kernel meets them:
    cuSOLVER failing, then a copy the kernel makes to pageable memory before anything else (the
    fp32 grouped GEMM's `offs.cpu()`), then a host sync, then Copy.cu's check of a copy between
    host and device (`copy_refusal`: `device` and `memory` say which tensors are device memory).
    `device` None: the op runs inside a compiled graph that a capture records as one device op,
    every operand device memory, so only the copies CUDA's kernel makes inside itself
    (`kernel_host_copy`) are met."""
    failure = solver_failure_in_capture(func, args, kwargs)
    if failure is not None:
        return CaptureRefusal(failure, "cuSOLVER's eigensolver fails inside a capture; compute it "
                                       "before capture", True)
    copies_inside = copies_to_host_inside(func)
    copy = _copy_met(func, args, kwargs, device, memory) if copies_inside else None
    if copy is None:
        # Where host and device memory are one (the plain emulator), ATen's own view decides.
        on_device = _on_device(None if getattr(memory, "all_device", False) else memory)
        reason = sync_reason(func, args, kwargs, on_device) if may_sync(func) else None
        if reason:
            return CaptureRefusal(cuda_errors.NOT_PERMITTED, reason, True)
        if not copies_inside:  # a kernel's own copy was asked above; nothing else differs
            copy = _copy_met(func, args, kwargs, device, memory)
    if copy is None:
        return None
    text, why = copy
    return CaptureRefusal(text, why, text == cuda_errors.NOT_PERMITTED)


def _copy_met(func: torch_internals.OpOverload, args: tuple, kwargs: dict,
              device: torch.device | None, memory: Any) -> tuple[str, str] | None:
    if device is None:
        why = kernel_host_copy(func, args, kwargs)
        return None if why is None else (cuda_errors.PAGEABLE_COPY, why)
    return copy_refusal(func, args, kwargs, device, memory)


def equal_on_host(a: torch.Tensor, b: torch.Tensor) -> bool | None:
    """What CUDA's `torch.equal` answers without reading device data (shapes differ, nothing to
    compare, or both sides are the very same memory), else None."""
    if a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    if (torch_internals.storage_key(a.untyped_storage())
            == torch_internals.storage_key(b.untyped_storage()) and a.dtype == b.dtype
            and a.storage_offset() == b.storage_offset() and a.stride() == b.stride()
            and a.layout == b.layout and a.is_neg() == b.is_neg() and a.is_conj() == b.is_conj()):
        return True
    return None


_GROUPED_MM = getattr(aten, "_grouped_mm", None) and aten._grouped_mm.default


def _grouped_mm_reason(named: dict) -> str | None:
    """CUDA's grouped GEMM kernel takes bf16 only; its fallback for other dtypes copies `offs` to
    pageable host memory (`offs.value().cpu()`, GroupedMMUtils.h) to loop over the groups: a
    blocking copy that Copy.cu refuses in a capture before it enqueues anything."""
    dtypes = {named["self"].dtype, named["mat2"].dtype, named.get("out_dtype") or named["self"].dtype}
    if named.get("offs") is None or dtypes == {torch.bfloat16}:
        return None
    names = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
    return (f"with {names} operands, CUDA's grouped GEMM falls back to a loop that copies `offs` "
            f"to the host (`offs.cpu()`, a copy into pageable memory); only bf16 operands (and "
            f"output) take the capturable kernel: cast the input and the expert weights to bf16")


# `isin` of tensors (TensorCompare.cpp, as read on PyTorch's main branch): with many test elements
# (numpy's heuristic, `test_elements.numel() >= int(10 * elements.numel() ** 0.145)`) it sorts, and
# unless assume_unique=True it first calls `at::_unique` on both inputs, whose CUDA kernel reads the
# number of unique values on the host (a copy and a stream sync; PyTorch #130078: "operation not
# permitted when stream is capturing"). The device's dispatch sees `isin` whole and the CPU's
# kernel reads host memory, so nothing else tells.
_ISINS = frozenset(getattr(aten.isin, name) for name in (
    "Tensor_Tensor", "Tensor_Tensor_out", "Scalar_Tensor", "Scalar_Tensor_out")
    if hasattr(aten.isin, name))


def _isin_reason(named: dict) -> str | None:
    elements = named.get("elements")  # `element`, a Scalar, in the Scalar_Tensor overloads
    count = elements.numel() if isinstance(elements, torch.Tensor) else 1  # a Scalar: one element
    tests = named["test_elements"].numel()
    if count == 0 or named.get("assume_unique") or tests < int(10.0 * count ** 0.145):
        return None
    return (f"with {tests} test elements against {count} elements CUDA's isin sorts, and first "
            f"calls `_unique` on both inputs, which reads the number of unique values on the host "
            f"(a sync; the direct comparison is taken below {int(10.0 * count ** 0.145)} test "
            f"elements): pass assume_unique=True for unique inputs, or compare "
            f"`(elements.unsqueeze(-1) == test_elements).any(-1)`")


def _isin_copy_reason(named: dict) -> str | None:
    """Sorting with assume_unique=True, CUDA's isin (TensorCompare.cpp's isin_sorting) marks the
    last sorted element with `duplicate_mask.index_put_({-1}, invert)`: a host scalar tensor copied
    into device memory (`copy_` from pageable memory, which Copy.cu refuses in a capture; measured
    on an H100, torch 2.11). Without assume_unique `_unique`'s sync comes first (`_isin_reason`)."""
    elements = named.get("elements")
    count = elements.numel() if isinstance(elements, torch.Tensor) else 1
    tests = named["test_elements"].numel()
    if count == 0 or not named.get("assume_unique") or tests < int(10.0 * count ** 0.145):
        return None
    return (f"with {tests} test elements against {count} elements CUDA's isin sorts, and marks the "
            f"last sorted element by copying a host scalar tensor to the device (a copy from "
            f"pageable memory; the direct comparison is taken below {int(10.0 * count ** 0.145)} "
            f"test elements): compare `(elements.unsqueeze(-1) == test_elements).any(-1)`")


# `mode` along a dimension (cuda/TensorModeKernel.cpp, as read on PyTorch's main branch): one block
# per slice computes it on the device when the slice holds at most 2048 values (twice CUDA's 1024
# threads a block) and 32-bit indexing reaches the input; otherwise `launch_apply_mode_kernel` loops
# over the slices on the host, each a thrust sort and count whose result the host reads
# (`thrust::inner_product`, then `memcpy_and_sync` of the answer): a stream sync per slice. The
# device's dispatch sees `mode` whole and the CPU's kernel reads host memory.
_MODES = frozenset(getattr(aten.mode, name) for name in ("default", "values", "dimname",
                                                         "dimname_out") if hasattr(aten.mode, name))
_MODE_FUSED_LIMIT = 2048


def _mode_reason(named: dict) -> str | None:
    self = named["self"]
    if self.dim() == 0 or self.numel() == 0:
        return None
    dim = named.get("dim", -1)
    size = self.size(dim if isinstance(dim, int) else self.names.index(dim))
    if size == 1 or (size <= _MODE_FUSED_LIMIT and self.numel() <= 2 ** 31 - 1):
        return None
    return (f"CUDA's mode of slices of {size} values (over {_MODE_FUSED_LIMIT}, its fused kernel's "
            f"limit) sorts each slice with thrust and reads the result on the host, a sync per "
            f"slice; compute it before capture, or with slices of at most {_MODE_FUSED_LIMIT} values")


# `masked_fill` given a 0-dim value tensor: CUDA's masked_fill__cuda passes the value to its
# kernel as a host scalar, `value.item()` (cuda/Indexing.cu, as read on PyTorch's main branch; the
# open PR #190512 would read it on the device), a copy to the host and a stream sync where the
# value is device memory; a host value is read in place. The out-of-place overloads call it.
_MASKED_FILLS_OF_A_TENSOR = frozenset(getattr(packet, name) for packet, name in (
    (aten.masked_fill_, "Tensor"), (aten.masked_fill, "Tensor"), (aten.masked_fill, "Tensor_out"))
    if hasattr(packet, name))


# `index_fill_(dim, index, Tensor value)` (TensorAdvancedIndexing.cpp) calls the Scalar overload
# with `value.item()`, and `linspace`/`logspace` of tensor bounds (TensorFactories.cpp, their
# CompositeExplicitAutograd kernels) call the Scalar forms with `start.item()` and `end.item()`:
# each a copy to the host and a stream sync where the tensor is device memory, inside a call the
# device's dispatch sees whole.
_INDEX_FILLS_OF_A_TENSOR = frozenset(getattr(packet, name) for packet, name in (
    (aten.index_fill_, "int_Tensor"), (aten.index_fill, "int_Tensor"),
    (aten.index_fill, "int_Tensor_out")) if hasattr(packet, name))
_RANGES_OF_TENSORS = frozenset(getattr(packet, name) for packet in (aten.linspace, aten.logspace)
                               for name in ("Tensor_Tensor", "Tensor_Scalar", "Scalar_Tensor",
                                            "Tensor_Tensor_out", "Tensor_Scalar_out",
                                            "Scalar_Tensor_out") if hasattr(packet, name))
# `segment_reduce` by `lengths` (SegmentReduce.cpp, the kernel every device shares) checks them on
# the host unless `unsafe=True`: `lengths.min().item()` and `all(lengths.sum(-1) == ...).item()`,
# two copies to the host and syncs where the lengths are device memory. By `offsets` it checks
# nothing.
_SEGMENT_REDUCES = frozenset(getattr(aten.segment_reduce, name) for name in ("default", "out")
                             if hasattr(aten.segment_reduce, name))
# `searchsorted` given a `sorter` (BucketizationUtils.h's `searchsorted_pre_check`, shared by every
# device) checks the sorter's range on the host: `sorter.aminmax()`, then `.item()` of each, a copy
# to the host and a stream sync where the sorter is device memory (measured on an H100, torch 2.11:
# "operation not permitted when stream is capturing"). Without a sorter it reads nothing.
_SEARCHSORTEDS = frozenset(getattr(aten.searchsorted, name) for name in (
    "Tensor", "Tensor_out", "Scalar", "Scalar_out") if hasattr(aten.searchsorted, name))
_READS_A_VALUE = (_MASKED_FILLS_OF_A_TENSOR | _INDEX_FILLS_OF_A_TENSOR | _RANGES_OF_TENSORS
                  | _SEGMENT_REDUCES | _SEARCHSORTEDS)


def reads_a_device_value(func: torch_internals.OpOverload, args: tuple, kwargs: dict,
                         on_device: Callable[[torch.Tensor], bool]) -> str | None:
    """Why CUDA's kernel of this op reads a device tensor's value on the host before it launches
    (a copy and a stream sync that the device's dispatch never sees), or None. `on_device` says
    which tensors are device memory."""
    if func not in _READS_A_VALUE:
        return None
    named = bind(func, args, kwargs)
    if func in _RANGES_OF_TENSORS:
        read = [n for n in ("start", "end")
                if isinstance(named.get(n), torch.Tensor) and on_device(named[n])]
        if not read:
            return None
        name = func.overloadpacket.__name__.split(".")[-1]
        return (f"CUDA's {name} of tensor bounds reads them on the host "
                f"({', '.join(f'`{n}.item()`' for n in read)}), a copy to the host and a sync; pass "
                f"Python numbers, or build the range as `start + (end - start) * "
                f"torch.arange(steps) / (steps - 1)` on the device")
    if func in _SEGMENT_REDUCES:
        lengths = named.get("lengths")
        if (named.get("offsets") is not None or named.get("unsafe") or lengths is None
                or not on_device(lengths)):
            return None
        return ("CUDA's segment_reduce checks its device `lengths` on the host "
                "(`lengths.min().item()`, then their sums against the data's size), copies to the "
                "host and syncs; pass `offsets` (the lengths' cumulative sum from 0), which it does "
                "not check, or `unsafe=True` once the lengths are known good")
    if func in _SEARCHSORTEDS:
        sorter = named.get("sorter")
        if not isinstance(sorter, torch.Tensor) or sorter.numel() == 0 or not on_device(sorter):
            return None
        return ("CUDA's searchsorted checks its device `sorter` on the host (`sorter.aminmax()`, "
                "then `.item()` of each), a copy to the host and a sync; gather the sorted "
                "sequence once before capture (`sorted_sequence.gather(-1, sorter)`) and search it "
                "without a sorter")
    value = named["value"]
    if not isinstance(value, torch.Tensor) or value.dim() != 0 or not on_device(value):
        return None
    if func in _INDEX_FILLS_OF_A_TENSOR:
        return ("CUDA's index_fill of a tensor value takes it as a host scalar (`value.item()`), a "
                "copy of the device value to the host and a sync; pass a Python number, or scatter "
                "the value on the device (`self.index_copy_(dim, index, value.expand(shape))`)")
    return ("CUDA's masked_fill takes its value as a host scalar (`value.item()`), a copy of the "
            "device value to the host and a sync; pass a Python number, or write "
            "`torch.where(mask, value, self)`, which reads the value on the device")


def _is_masked_fill(func: torch_internals.OpOverload, named: dict,
                    on_device: Callable[[torch.Tensor], bool]) -> bool:
    """`x[mask] = scalar`: index_put turns this into masked_fill_, which never syncs (ATen's
    canDispatchToMaskedFill: one mask on self's device, a one-element value on the host; a value
    on the device keeps the boolean mask's `nonzero`, a sync)."""
    if func not in (aten.index_put.default, aten.index_put_.default):
        return False
    value, self = named["values"], named["self"]
    masks = [t for t in named["indices"] if t is not None]
    return (value.numel() == 1 and not on_device(value) and len(masks) == 1
            and masks[0].dtype in (torch.bool, torch.uint8) and on_device(masks[0]) == on_device(self))


def _on_device(memory: Any) -> Callable[[torch.Tensor], bool]:
    """Whether a tensor is accelerator memory: `memory`'s answer, else not on the host device."""
    return memory.is_device if memory is not None else (lambda t: t.device.type != "cpu")


def _pinned(memory: Any) -> Callable[[torch.Tensor], bool]:
    return memory.is_pinned if memory is not None else (lambda t: t.is_pinned())


def copy_reason(func: torch_internals.OpOverload, args: tuple, kwargs: dict,
                device: torch.device, memory: Any = None) -> str | None:
    """Why a copy between the host and an accelerator device cannot be captured, or None.
    `memory` (emulator/memory.py) says which tensors are device memory; by default, every tensor
    not on the host device."""
    refusal = copy_refusal(func, args, kwargs, device, memory)
    return None if refusal is None else refusal[1]


def copy_refusal(func: torch_internals.OpOverload, args: tuple, kwargs: dict,
                 device: torch.device, memory: Any = None) -> tuple[str, str] | None:
    """(CUDA's message, why) for a copy between the host and an accelerator device that cannot be
    captured, or None: Copy.cu refuses a pageable host side in either direction, and a pinned one
    without non_blocking waits for the stream (a sync)."""
    if (device.type == "cpu" and memory is None) or getattr(memory, "all_device", False):
        return None
    on_device, pinned = _on_device(memory), _pinned(memory)
    if func is aten._to_copy.default:
        named = bind(func, args, kwargs)
        target = named.get("device")
        source = named["self"]
        if target is not None and torch.device(target).type != source.device.type:
            to_device = torch.device(target).type != "cpu"
            # A copy to the host lands in fresh pageable memory unless pin_memory=True asks.
            host_pinned = pinned(source) if to_device else bool(named.get("pin_memory"))
            return _copy_problem(to_device, host_pinned, bool(named.get("non_blocking")))
    elif func is aten.copy_.default:
        named = bind(func, args, kwargs)
        if on_device(named["self"]) != on_device(named["src"]):
            to_device = on_device(named["self"])
            host = named["src"] if to_device else named["self"]
            return _copy_problem(to_device, pinned(host), bool(named.get("non_blocking")))
    elif func in _INDEX_PUTS:
        named = bind(func, args, kwargs)
        values, target = named["values"], named["self"]
        if (not on_device(values) and on_device(target) and not pinned(values)
                and not _is_masked_fill(func, named, on_device)):
            # `y[index] = 1.0`: ATen copies the host value to the device first (only a boolean mask
            # with a scalar becomes masked_fill_, which takes the value by argument).
            return (cuda_errors.PAGEABLE_COPY,
                    f"copies its host value (a tensor of shape {tuple(values.shape)}, as `y[index] = "
                    f"scalar` makes) to the device, a copy from pageable host memory; write "
                    f"`y.index_fill_(0, index, scalar)`, or make the value a device tensor before "
                    f"capture")
    elif copies_to_host_inside(func):
        why = kernel_host_copy(func, args, kwargs)
        # `self`; `log_probs`, `grad` for the CTC losses; isin's elements may be a Scalar
        first = "test_elements" if func in _ISINS else func._schema.arguments[0].name
        if why is not None and on_device(bind(func, args, kwargs)[first]):
            return cuda_errors.PAGEABLE_COPY, why
    elif func in _READS_A_VALUE:
        why = reads_a_device_value(func, args, kwargs, on_device)
        if why is not None:
            return cuda_errors.NOT_PERMITTED, why
    elif func in _WHERES:
        named = bind(func, args, kwargs)
        operands = [named[n] for n in ("condition", "self", "other")]
        if any(on_device(t) for t in operands):
            for t in operands:
                if not on_device(t) and t.dim() == 0 and not pinned(t):
                    # ATen's where moves 0-dim host operands to the device (`.to(device)`), where
                    # a binary op takes them as kernel arguments.
                    return (cuda_errors.PAGEABLE_COPY,
                            f"copies a 0-dim host tensor operand to the device, a copy from "
                            f"pageable host memory; pass a Python number instead, or a device "
                            f"tensor made before capture")
    return None


# CUDA's CTC loss (LossCTC.cu, forward and backward, any targets' dtype) builds the lengths on the
# host and copies them to the device with `at::tensor(target_lengths, targets.options())`, a
# blocking copy from pageable memory, before its first kernel; the Tensor-lengths overload first
# copies device lengths to the host (`.to(kCPU)`, LossCTC.cpp), and host targets are copied to the
# device (`targets.to(device)`): each one Copy.cu's refusal, the capture still valid. Their tag
# (dynamic_output_shape) would refuse them as a sync that invalidates the capture. cuDNN's CTC
# (int32 host targets, all input lengths the full length) is never taken on the emulated device.
_CTC_LOSSES = _packets("_ctc_loss", "_ctc_loss_backward")
# CUDA's SVD (`_linalg_svd`: svd, svdvals, the spectral norm; `linalg_pinv` through it) meets
# Copy.cu's refusal in a capture before its info codes are read (measured on an H100, torch 2.11,
# a 4x4 matrix; an 8x8 one raised a cuSOLVER status instead: docs/fidelity.md).
_SVDS = _packets("_linalg_svd")
# CUDA's bincount (SummaryOps.cu) of a non-empty input copies its minimum and maximum to pageable
# host memory (`self.min().cpu()`, `self.max().cpu()`) to check the values and count the bins:
# Copy.cu's refusal, the capture still valid (measured on an H100, torch 2.11). An empty input
# takes `zeros(minlength)` without it. Its tag (dynamic_output_shape) would refuse it as a sync.
_BINCOUNTS = _packets("bincount")
_HOST_COPYING_KERNELS = (_packets("linalg_matrix_exp", "histc", "linalg_pinv", "_grouped_mm", "isin")
                         | _CTC_LOSSES | _SVDS | _BINCOUNTS)


def copies_to_host_inside(func: torch_internals.OpOverload) -> bool:
    """Whether `kernel_host_copy` can be other than None for some arguments of this op."""
    return getattr(func, "overloadpacket", None) in _HOST_COPYING_KERNELS


def kernel_host_copy(func: torch_internals.OpOverload, args: tuple, kwargs: dict) -> str | None:
    """Why CUDA's kernel for this op copies device data to pageable host memory inside itself (a
    blocking copy, and a sync, that the device's dispatch never sees), or None.
    `linalg.matrix_exp`: CUDA's mexp_impl picks each matrix's Taylor degree from its 1-norm on the
    host (`norm.to(at::kCPU)`); a 0x0 or 1x1 matrix takes `exp` without it. `histc` with no range
    (min == max, the default) of a non-empty input: CUDA's kernel reads the input's minimum and
    maximum on the host (`self.min().cpu()`). The CTC losses: CUDA's kernel copies the lengths
    to the device from pageable host memory (`at::tensor(target_lengths)`). The SVD (`pinv`
    through it): Copy.cu's refusal, as measured. `_grouped_mm` of other than bf16 operands: CUDA's
    fallback loops over the groups after `offs.cpu()`."""
    if not copies_to_host_inside(func):
        return None
    packet = _kernel_met(func, args, kwargs)
    if packet in _CTC_LOSSES:
        return ("CUDA's kernel copies the input and target lengths from pageable host memory to "
                "the device (`at::tensor(target_lengths)`, a blocking copy; length tensors on the "
                "device are first copied to the host); compute the loss outside the capture")
    if packet in _SVDS:
        named = bind(func, args, kwargs)
        matrix = named.get("A", named.get("self"))
        if isinstance(matrix, torch.Tensor) and matrix.numel() == 0:
            return None  # an empty matrix: no kernel runs (the op database's sample, H100)
        return ("CUDA's SVD copies device data to pageable host memory inside its kernel (Copy.cu's "
                "refusal, measured on an H100 with torch 2.11, for `svd`, `pinv` and the spectral "
                "norm); compute it before capture")
    if func is _GROUPED_MM:
        return _grouped_mm_reason(bind(func, args, kwargs))
    if packet in _BINCOUNTS:
        if bind(func, args, kwargs)["self"].numel() == 0:
            return None
        return ("CUDA's bincount copies the input's minimum and maximum to pageable host memory "
                "(`self.min().cpu()`, `self.max().cpu()`) to check the values and size its output; "
                "count with `zeros(n).scatter_add_(0, values, ones_like(values))` of a known `n` "
                "instead")
    if packet is aten.isin:
        return _isin_copy_reason(bind(func, args, kwargs))
    if packet is aten.histc:
        named = bind(func, args, kwargs)
        if named["min"] != named["max"] or named["self"].numel() == 0:
            return None
        return ("CUDA's kernel copies the input's minimum and maximum to pageable host memory "
                "when no range is given (min == max, `self.min().cpu()`, a sync); pass the range "
                "(`min=`, `max=`)")
    if packet is not aten.linalg_matrix_exp:
        return None  # `pinv` through eigh: cuSOLVER fails first (solver_failure_in_capture)
    if bind(func, args, kwargs)["self"].size(-1) <= 1:
        return None
    return ("CUDA's kernel copies the matrices' 1-norms to pageable host memory to pick each "
            "one's Taylor degree (`norm.to(kCPU)`, a sync); compute the exponential before "
            "capture, or as a fixed-degree series of matmuls inside it")


_WHERES = frozenset({aten.where.self, aten.where.self_out})
_INDEX_PUTS = frozenset({aten.index_put.default, aten.index_put_.default,
                         aten._index_put_impl_.default})


# CUDA's layer norm kernel reads weight and bias as the input's dtype ("expected scalar type
# BFloat16 but found Float"); the CPU kernel has a mixed-dtype path for float32 parameters.
_SAME_DTYPE_PARAMETERS_ON_CUDA = {aten.native_layer_norm.default: ("weight", "bias")}


def kernel_dtype_reason(func: torch_internals.OpOverload, args: tuple, kwargs: dict,
                        device: torch.device) -> str | None:
    """Why `device`'s kernel refuses this dtype combination (which the meta kernel accepts), or None."""
    if device.type != "cuda" or func not in _SAME_DTYPE_PARAMETERS_ON_CUDA:
        return None
    named = bind(func, args, kwargs)
    dtype = named["input"].dtype
    for name in _SAME_DTYPE_PARAMETERS_ON_CUDA[func]:
        param = named.get(name)
        if isinstance(param, torch.Tensor) and param.dtype != dtype:
            return (f"CUDA's kernel takes {name} in the input's dtype {dtype}, got {param.dtype} "
                    f"(eager on {device} raises \"expected scalar type "
                    f"{scalar_type_name(dtype)} but found {scalar_type_name(param.dtype)}\"; the "
                    f"CPU kernel accepts float32 parameters): cast the parameters to {dtype}")
    return None


_SCALAR_TYPE_NAMES = {
    torch.bool: "Bool", torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short",
    torch.int32: "Int", torch.int64: "Long", torch.bfloat16: "BFloat16", torch.float16: "Half",
    torch.float32: "Float", torch.float64: "Double", torch.complex32: "ComplexHalf",
    torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble"}


def scalar_type_name(dtype: torch.dtype) -> str:
    """c10's ScalarType name of `dtype`, as its "expected scalar type X but found Y" says it."""
    return _SCALAR_TYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def _copy_problem(to_device: bool, host_pinned: bool,
                  non_blocking: bool) -> tuple[str, str] | None:
    direction = "from pageable host memory to the device" if to_device else \
        "from the device to pageable host memory"
    if not host_pinned:
        return (cuda_errors.PAGEABLE_COPY,
                f"copies {direction}; only a pinned host buffer copied with non_blocking=True "
                f"is capturable")
    if not non_blocking:
        side = "from a pinned host buffer to the device" if to_device else \
            "from the device to a pinned host buffer"
        return (cuda_errors.NOT_PERMITTED,
                f"copies {side} without non_blocking=True, so the host waits for the stream "
                f"(a sync); pass non_blocking=True")
    return None


# Reduced losses whose out= kernel first sizes the out like the unreduced loss and then reduces
# into it: given the final (scalar) out it warns "An output with one or more elements was resized"
# on every call. The functional kernel does not; a replay runs that and copies its result.
_OUT_KERNEL_RESIZES_ITS_OUT = frozenset({
    aten.mse_loss.default, aten.smooth_l1_loss.default, aten.huber_loss.default,
    aten.soft_margin_loss.default, aten.binary_cross_entropy.default})


@functools.lru_cache(maxsize=None)
def out_overload(func: torch_internals.OpOverload) -> torch_internals.OpOverload | None:
    """The `out=` sibling of a functional op that takes the same arguments and fills a captured
    output of the right shape as it is, or None."""
    if func in _OUT_KERNEL_RESIZES_ITS_OUT:
        return None
    schema = func._schema
    if not schema.returns or any(str(r.type) != "Tensor" for r in schema.returns):
        return None
    packet = func.overloadpacket
    for name in packet.overloads():
        candidate = getattr(packet, name)
        if _takes_same_arguments(schema, candidate._schema):
            return candidate
    return None


def _takes_same_arguments(functional: Any, candidate: Any) -> bool:
    outs = [a for a in candidate.arguments if a.is_out]
    if len(outs) != len(functional.returns) or any(str(a.type) != "Tensor" for a in outs):
        return False
    theirs = {a.name: a for a in candidate.arguments if not a.is_out}
    ours = {a.name for a in functional.arguments}
    for arg in functional.arguments:
        match = theirs.get(arg.name)
        if match is None and arg.name not in _FACTORY_KWARGS:
            return False
        if match is not None and str(match.type) != str(arg.type):
            return False
    return all(a.has_default_value() or a.name in ours for a in theirs.values())


def out_names(func: torch_internals.OpOverload) -> list[str]:
    return [a.name for a in func._schema.arguments if a.is_out]


# Norms whose CPU kernel returns its statistics (mean, rstd / invstd) in the input's reduced dtype
# unless a parameter is float32, where the meta kernel (and CUDA) always give float32.
_CPU_STATS_IN_INPUT_DTYPE = frozenset({
    aten.native_layer_norm.default, aten.native_batch_norm.default,
    aten._native_batch_norm_legit.default, aten._native_batch_norm_legit.no_stats,
    aten._native_batch_norm_legit_no_training.default})
_NORM_PARAMETERS = ("weight", "bias", "running_mean", "running_var")
_REDUCED = (torch.bfloat16, torch.float16)


def device_result_dtypes(func: torch_internals.OpOverload, args: tuple, kwargs: dict, results: Any,
                         device: torch.device) -> Any:
    """`results` (from the meta kernel) with the dtypes `device`'s own kernel returns."""
    if device.type != "cpu" or func not in _CPU_STATS_IN_INPUT_DTYPE:
        return results
    named = bind(func, args, kwargs)
    dtype = named["input"].dtype
    mixed = any(isinstance(named.get(p), torch.Tensor) and named[p].dtype == torch.float32
                for p in _NORM_PARAMETERS)
    if dtype not in _REDUCED or mixed:
        return results
    first, *stats = results
    return (first, *(s.to(dtype) for s in stats))


ReplayStep = tuple[Callable[..., Any], tuple, dict]


def _fill(value_of: Callable[[dict], Any]) -> Callable[[dict, torch.Tensor], ReplayStep]:
    return lambda named, out: (torch.Tensor.fill_, (out, value_of(named)), {})


def _copy_from(name: str) -> Callable[[dict, torch.Tensor], ReplayStep]:
    return lambda named, out: (torch.Tensor.copy_, (out, named[name]), {})


def _zero(named: dict, out: torch.Tensor) -> ReplayStep:
    return (torch.Tensor.zero_, (out,), {})


# Factories and casts replayed as fills and copies into the captured output: no allocation, and
# faster than their out= overloads. `None` marks work that needs no replay at all.
_SPECIAL: dict[Any, Callable[[dict, torch.Tensor], ReplayStep] | None] = {
    aten.empty.memory_format: None,
    aten.empty_strided.default: None,
    aten.empty_like.default: None,
    aten.new_empty.default: None,
    aten.new_empty_strided.default: None,
    aten.zeros.default: _zero,
    aten.zeros_like.default: _zero,
    aten.new_zeros.default: _zero,
    aten.ones.default: _fill(lambda n: 1),
    aten.ones_like.default: _fill(lambda n: 1),
    aten.new_ones.default: _fill(lambda n: 1),
    aten.full.default: _fill(lambda n: n["fill_value"]),
    aten.full_like.default: _fill(lambda n: n["fill_value"]),
    aten.new_full.default: _fill(lambda n: n["fill_value"]),
    aten.scalar_tensor.default: _fill(lambda n: n["s"]),
    aten._to_copy.default: _copy_from("self"),
    aten.clone.default: _copy_from("self"),
    aten.lift_fresh_copy.default: _copy_from("self"),
}


def special_replay(func: Any) -> tuple[bool, Callable[[dict, torch.Tensor], ReplayStep] | None]:
    """(True, maker) when the op has a fill/copy replay (maker None: nothing to replay)."""
    if func in _SPECIAL:
        return True, _SPECIAL[func]
    return False, None
