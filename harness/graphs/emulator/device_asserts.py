"""An index out of bounds inside a replayed kernel, in CUDA's words.

CUDA's indexing kernels (index_copy_, index_select, index_add_, gather, scatter, embedding,
embedding_bag, advanced indexing, ...) check each index on the device with `CUDA_KERNEL_ASSERT`: a
bad index fails the kernel, and the host learns it at its next CUDA call as `torch.AcceleratorError`
"CUDA error: device-side assert triggered" (the context is unusable after it). A replay runs the cpu kernels,
whose host-side check raises `IndexError` (`RuntimeError` for gather and scatter) with its own text
at the op. Code written against CUDA catches the `AcceleratorError`, so a replay raises
`DeviceAssertError` (one) with CUDA's message first, then the cpu kernel's words, the op and, when
the capture kept a trace, the line that issued it.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

import torch

from harness.graphs.emulator.callsite import describe_frame
from harness.graphs.emulator.cuda_errors import cuda_first

# c10/cuda/CUDAException.cpp: "CUDA error: " and cudaGetErrorString(cudaErrorAssert).
DEVICE_ASSERT = "CUDA error: device-side assert triggered"

# The cpu kernels' texts for an index value outside its dimension. Not "Dimension out of range":
# that is a shape check CUDA makes on the host too, before any kernel runs. A class index outside
# the classes of `nll_loss` (and `cross_entropy` through it) is one too: CUDA's LossNLL.cu and
# LossNLL2d.cu kernels assert it on the device. So does EmbeddingBag.cu for a bag's index, where
# the cpu's EmbeddingBag.cpp checks it on the host (measured on an H100, torch 2.11).
_INDEX_OUT_OF_BOUNDS = re.compile(r"index -?\d+ is out of bounds for dimension"
                                  r"|index out of range in self"
                                  r"|out of range: tried to access index"
                                  r"|^Target -?\d+ is out of bounds\."
                                  r"|^Index \d+ of input takes value -?\d+ which is not in the valid range"
                                  r"|^embedding_bag: Expected idx >= 0 && idx < num_embeddings")

# The aten ops whose CUDA kernels assert on an index, for naming the op of an untraced replay.
_ASSERTING_OPS = ("index_copy_", "index_copy", "index_select", "index_add_", "index_add",
                  "index_fill_", "index_fill", "index_put_", "index_put", "_index_put_impl_",
                  "index", "gather", "scatter", "scatter_", "scatter_add", "scatter_add_",
                  "scatter_reduce", "scatter_reduce_", "embedding", "take", "put_",
                  "nll_loss_forward", "nll_loss2d_forward", "_embedding_bag",
                  "_embedding_bag_forward_only")


class DeviceAssertError(torch.AcceleratorError):
    """A replayed kernel met an index out of bounds: on CUDA a device-side assertion, raised by
    torch as `torch.AcceleratorError` at the next synchronization. `op` is the aten op when known."""

    def __init__(self, message: str, *, op: str | None = None) -> None:
        super().__init__(message)
        self.op = op


def is_index_out_of_bounds(error: BaseException) -> bool:
    """Whether a cpu kernel raised `error` for an index value CUDA's kernel checks on the device."""
    return isinstance(error, (IndexError, RuntimeError)) and not isinstance(error, torch.AcceleratorError) \
        and _INDEX_OUT_OF_BOUNDS.search(str(error)) is not None


def device_assert_error(error: BaseException, kernels: Iterable[Any],
                        records: Iterable[Any] = ()) -> DeviceAssertError:
    """CUDA's error for a replayed call that raised `error`: `kernels` the callables it may have run
    (its own, an op it carried), `records` the trace's OpRecords of that call (none untraced)."""
    records = list(records)
    op = records[0].op if records else next(filter(None, map(_op_name, kernels)), None)
    where = ""
    if records and records[0].frames:
        where = f", issued at {describe_frame(records[0].frames[0])}"
    cpu_text = (str(error).strip().splitlines() or [""])[0]
    detail = (f"{op or 'an indexing op'} in a graph replay: {cpu_text}{where}. On CUDA the kernel's "
              f"device-side assertion fails and is reported at the next synchronization, leaving the "
              f"CUDA context unusable; the index is computed from state the capture froze (a write "
              f"position, a cache length): check it against the size it indexes for every replayed step")
    return DeviceAssertError(cuda_first(DEVICE_ASSERT, detail), op=op)


def eager_device_assert_error(error: BaseException, op: str) -> DeviceAssertError:
    """CUDA's error for an eager call on device memory that met an index out of bounds: CUDA raises
    it at the next synchronization, the emulated device at the call (earlier, same type and text)."""
    cpu_text = (str(error).strip().splitlines() or [""])[0]
    detail = (f"{op} on the device: {cpu_text}. On CUDA the kernel's device-side assertion fails "
              f"and is reported at the next synchronization (here at the call), leaving the CUDA "
              f"context unusable")
    return DeviceAssertError(cuda_first(DEVICE_ASSERT, detail), op=op)


def _op_name(fn: Any) -> str | None:
    """The aten op whose kernel `fn` is, among the ops that assert on an index."""
    if not callable(fn):
        return None
    for name in _ASSERTING_OPS:
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            if getattr(packet, overload)._op is fn:
                return f"aten.{name}.{overload}"
    return None
