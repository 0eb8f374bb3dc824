"""Calls the CPU build runs and CUDA has no kernel for, refused for device tensors in CUDA's words.

`torch.histogram` (`aten::histogram.bin_ct`, `histogram.bins_tensor`) and `torch.histogramdd`
(`aten::_histogramdd_bin_edges`, `_histogramdd_from_bin_tensors`, through the composite
`histogramdd`) have CPU kernels only, on every CUDA wheel from 2.11 to 2.15 (their dispatch tables:
no CUDA kernel, no composite one); on a GPU a call with cuda tensors raises the dispatcher's
`NotImplementedError` ("Could not run '...' with arguments from the 'CUDA' backend"). The emulated
device runs its tensors on the CPU's kernels, so the call computed an answer a GPU never gives.
`torch.histc` is the counting op CUDA has.

`torch.sparse.mm` given a `reduce` reaches `aten::_sparse_mm_reduce_impl`, which has a SparseCsrCPU
kernel only (its dispatch table, 2.11 to 2.15): a GPU refuses it for a sparse CSR cuda tensor
(NotImplementedError, backend 'SparseCsrCUDA'); without `reduce` CUDA has `_sparse_mm`'s kernel."""

from __future__ import annotations

from typing import Any, Callable

import torch


def _histogram_op(args: tuple, kwargs: dict) -> str:
    bins = args[1] if len(args) > 1 else kwargs.get("bins", 100)
    return "aten::histogram.bins_tensor" if isinstance(bins, torch.Tensor) else "aten::histogram.bin_ct"


def _histogramdd_op(args: tuple, kwargs: dict) -> str:
    bins = args[1] if len(args) > 1 else kwargs.get("bins")
    tensors = isinstance(bins, (list, tuple)) and bins and isinstance(bins[0], torch.Tensor)
    return "aten::_histogramdd_from_bin_tensors" if tensors else "aten::_histogramdd_bin_edges"


def _sparse_mm_op(args: tuple, kwargs: dict) -> str | None:
    return "aten::_sparse_mm_reduce_impl" if len(args) > 2 or "reduce" in kwargs else None


def _aten_ops() -> dict[Any, Callable[[tuple, dict], str | None]]:
    """The CPU-only aten ops called themselves (`torch.ops.aten.histogram.bin_ct(...)`, as
    compiled code and decompositions call them): each overload names itself, a packet the
    overload its arguments pick."""
    entries: dict[Any, Callable[[tuple, dict], str | None]] = {}
    for name, of_packet in (("histogram", _histogram_op),
                            ("_histogramdd_bin_edges", None),
                            ("_histogramdd_from_bin_cts", None),
                            ("_histogramdd_from_bin_tensors", None),
                            ("_sparse_mm_reduce_impl", None)):
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:  # an op this build does not have
            continue
        entries[packet] = of_packet or (lambda args, kwargs, name=name: f"aten::{name}")
        for overload in packet.overloads():
            op = getattr(packet, overload)
            entries[op] = lambda args, kwargs, op=op: op._schema.name + (
                f".{op._schema.overload_name}" if op._schema.overload_name else "")
    return entries


# A call: the aten op whose missing CUDA kernel it meets first, from its arguments (None where
# these arguments reach a kernel CUDA has).
CPU_ONLY: dict[Any, Callable[[tuple, dict], str | None]] = {
    torch.histogram: _histogram_op,
    torch.Tensor.histogram: _histogram_op,
    torch.histogramdd: _histogramdd_op,
    torch.sparse.mm: _sparse_mm_op,
    **_aten_ops(),
}
_INSTEAD = {
    "aten::_sparse_mm_reduce_impl": "reduce on the host, or use torch.sparse.mm without `reduce`",
}


def refused(func: Callable, args: tuple, kwargs: dict) -> bool:
    """Whether `func` with these arguments meets an op CUDA has no kernel for."""
    return CPU_ONLY[func](args, kwargs) is not None


def no_cuda_kernel(func: Callable, args: tuple, kwargs: dict) -> NotImplementedError:
    """The dispatcher's error for `func` called with device tensors, in CUDA's words."""
    op = CPU_ONLY[func](args, kwargs)
    first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
    backend = "SparseCsrCUDA" if first is not None and first.layout == torch.sparse_csr else "CUDA"
    instead = _INSTEAD.get(op, "count with `torch.histc` on the device")
    return NotImplementedError(
        f"Could not run '{op}' with arguments from the '{backend}' backend. This could be because "
        f"the operator doesn't exist for this backend, or was omitted during the selective/custom "
        f"build process (if using custom build). (The emulated device: CUDA has no kernel for "
        f"this op, only the CPU has; {instead}, or move the input to the host first)")
