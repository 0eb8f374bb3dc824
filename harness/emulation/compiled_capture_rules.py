"""What CUDA refuses inside a compiled graph that a capture records as one op.

Inductor's code runs as one op of the device's (`harness_compiled::graph_N`, compiled_graphs.py)
while a capture records, so the aten ops its kernels call never reach the capture's rules. Most of
its kernels are CUDA's own fused code, which reads nothing on the host; but inductor lowers the
linear-algebra solvers, `linalg.matrix_exp`, `histc` and the CTC loss as fallback kernels that call
the aten op, and CUDA's kernel of that op reads device data on the host or copies from pageable
host memory inside itself as it does in eager code: `_linalg_check_errors`' `infos.any().item()`
(a sync, which invalidates the capture), matrix_exp's `norm.to(kCPU)`, histc's `self.min().cpu()`,
the CTC loss's `at::tensor(target_lengths)` (Copy.cu's refusal, the capture still valid). Where a
compiled graph meets a capture (cudagraph trees' recordings under mode="reduce-overhead", a
runtime that captures the callable its own backend compiled) the first such op of the graph is
refused as the eager call is: `FirstRefusal` finds it while the graph runs on fake tensors
(`_analyse`), and `refuse` raises it when a capture calls the graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness import torch_internals
from harness.graphs.base import CaptureError
from harness.graphs.emulator import cuda_errors, opinfo
from harness.graphs.emulator.callsite import at_callsite, current_callsite


@dataclass(frozen=True)
class Refusal:
    """An op of a compiled graph that CUDA refuses in a capture: its name, CUDA's message (a sync
    or Copy.cu's pageable copy) and why."""

    op: str
    cuda_text: str
    why: str


class FirstRefusal(torch_internals.TorchDispatchMode):
    """Notes the first op that CUDA refuses in a capture among the ops it sees (every tensor a
    device tensor: a graph that runs as one device op reads device memory only). A higher-order
    op (a checkpoint's `graphsafe_run_with_rng_state`, a `cond`) goes on to the fake tensor mode
    whole: its body's ops are not looked at."""

    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.refusal: Refusal | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch_internals.HigherOrderOperator):
            return func(*args, **kwargs)
        if self.refusal is None:
            self.refusal = _refusal(func, args, kwargs)
        if opinfo.is_composite(func):  # under inference mode a composite reaches a mode whole
            with self:
                return func.decompose(*args, **kwargs)
        return func(*args, **kwargs)


def _refusal(func: Any, args: tuple, kwargs: dict) -> Refusal | None:
    reason = opinfo.sync_reason(func, args, kwargs) if opinfo.may_sync(func) else None
    if reason is not None:
        return Refusal(opinfo.op_name(func), cuda_errors.NOT_PERMITTED, reason)
    why = opinfo.kernel_host_copy(func, args, kwargs)
    if why is not None:
        return Refusal(opinfo.op_name(func), cuda_errors.PAGEABLE_COPY, why)
    return None


def refuse(state: Any, graph: str, refusal: Refusal) -> None:
    """Raise what CUDA raises when a capture runs the compiled `graph` that holds `refusal`'s op:
    a refused sync invalidates the capture, a refused copy leaves it valid (Copy.cu checks before
    it enqueues anything). While a lint runs, report it instead."""
    detail = at_callsite(f"{refusal.op} (called by the compiled graph {graph}, a fallback kernel "
                         f"of inductor's) cannot be captured: {refusal.why}", current_callsite())
    if refusal.cuda_text == cuda_errors.NOT_PERMITTED:
        error: CaptureError = cuda_errors.sync_refused(detail, op=refusal.op)
        if state.capture is not None:
            state.capture.invalidate(error)
    else:
        error = CaptureError(cuda_errors.cuda_first(refusal.cuda_text, detail), op=refusal.op)
    state.refuse(error)
