"""Calls the CPU build runs and CUDA has no kernel for, refused for device tensors in CUDA's words.

`torch.histogram` (`aten::histogram.bin_ct`, `histogram.bins_tensor`) and `torch.histogramdd`
(`aten::_histogramdd_bin_edges`, `_histogramdd_from_bin_tensors`, through the composite
`histogramdd`) have CPU kernels only, on every CUDA wheel from 2.11 to 2.15 (their dispatch tables:
no CUDA kernel, no composite one); on a GPU a call with cuda tensors raises the dispatcher's
`NotImplementedError` ("Could not run '...' with arguments from the 'CUDA' backend"). The emulated
device runs its tensors on the CPU's kernels, so the call computed an answer a GPU never gives.
`torch.histc` is the counting op CUDA has."""

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


def _aten_ops() -> dict[Any, Callable[[tuple, dict], str]]:
    """The CPU-only aten ops called themselves (`torch.ops.aten.histogram.bin_ct(...)`, as
    compiled code and decompositions call them): each overload names itself, a packet the
    overload its arguments pick."""
    entries: dict[Any, Callable[[tuple, dict], str]] = {}
    for name, of_packet in (("histogram", _histogram_op),
                            ("_histogramdd_bin_edges", None),
                            ("_histogramdd_from_bin_cts", None),
                            ("_histogramdd_from_bin_tensors", None)):
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:  # an op this build does not have
            continue
        entries[packet] = of_packet or (lambda args, kwargs, name=name: f"aten::{name}")
        for overload in packet.overloads():
            op = getattr(packet, overload)
            entries[op] = lambda args, kwargs, op=op: op._schema.name + (
                f".{op._schema.overload_name}" if op._schema.overload_name else "")
    return entries


# A call: the aten op whose missing CUDA kernel it meets first, from its arguments.
CPU_ONLY: dict[Any, Callable[[tuple, dict], str]] = {
    torch.histogram: _histogram_op,
    torch.Tensor.histogram: _histogram_op,
    torch.histogramdd: _histogramdd_op,
    **_aten_ops(),
}


def no_cuda_kernel(func: Callable, args: tuple, kwargs: dict) -> NotImplementedError:
    """The dispatcher's error for `func` called with device tensors, in CUDA's words."""
    op = CPU_ONLY[func](args, kwargs)
    return NotImplementedError(
        f"Could not run '{op}' with arguments from the 'CUDA' backend. This could be because the "
        f"operator doesn't exist for this backend, or was omitted during the selective/custom "
        f"build process (if using custom build). (The emulated device: CUDA has no kernel for "
        f"this op, only the CPU has; count with `torch.histc` on the device, or move the input "
        f"to the host first)")
