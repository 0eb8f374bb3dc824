"""What CUDA refuses inside a compiled graph that a capture records as one op.

Inductor's code runs as one op of the device's (`harness_compiled::graph_N`, compiled_graphs.py)
while a capture records, so the aten ops its kernels call never reach the capture's rules. Most of
its kernels are CUDA's own fused code, which reads nothing on the host; but inductor lowers the
linear-algebra solvers, `linalg.matrix_exp`, `histc` and the CTC loss as fallback kernels that call
the aten op, and CUDA's kernel of that op reads device data on the host or copies from pageable
host memory inside itself as it does in eager code: matrix_exp's `norm.to(kCPU)`, histc's
`self.min().cpu()`, the CTC loss's `at::tensor(target_lengths)`, the SVD's copy (Copy.cu's
refusal, the capture still valid), cuSOLVER's eigensolvers failing (the capture invalidated).
`linalg.inv`, `solve` and `cholesky` are their `_ex` op then `_linalg_check_errors`
(`infos.any().item()`, a sync): AOTAutograd drops that check, which returns nothing, as dead code
where torch does not register it as an effectful op (torch 2.11, measured on an H100: a compiled
`linalg.inv` is captured and reduce-overhead records it), and keeps it where torch does (2.13).
Where a compiled graph meets a capture (cudagraph trees' recordings under mode="reduce-overhead",
a compiled call inside `torch.cuda.graph`, a runtime that captures the callable its own backend
compiled) the first such op of the graph is refused as the eager call is: `FirstRefusal` finds
it while the graph runs on fake tensors (`_analyse`), and `refuse` raises it when a capture calls
the graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness import torch_internals
from harness.graphs.emulator import cuda_errors, opinfo
from harness.graphs.emulator.callsite import at_callsite, current_callsite


@dataclass(frozen=True)
class Refusal:
    """An op of a compiled graph that CUDA refuses in a capture: its name and what CUDA raises (`opinfo.capture_refusal`)."""

    op: str
    cause: opinfo.CaptureRefusal


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
    if _dropped_from_compiled_graphs(func):
        return None
    refusal = opinfo.capture_refusal(func, args, kwargs, None)
    return None if refusal is None else Refusal(opinfo.op_name(func), refusal)


def _dropped_from_compiled_graphs(func: Any) -> bool:
    """Whether AOTAutograd drops this op from the graph it compiles: `_linalg_check_errors`
    returns nothing, so it is dead code unless torch registers it as effectful."""
    packet = getattr(func, "overloadpacket", None)
    if packet is None or packet is not getattr(torch.ops.aten, "_linalg_check_errors", None):
        return False
    effect_of = torch_internals.optional_name("op_effect")
    return effect_of is None or effect_of("aten::_linalg_check_errors") is None


def refuse(state: Any, graph: str, refusal: Refusal) -> None:
    """Raise what CUDA raises when a capture runs the compiled `graph` that holds `refusal`'s op:
    a refused sync invalidates the capture, a refused copy leaves it valid (Copy.cu checks before
    it enqueues anything). While a lint runs, report it instead."""
    detail = at_callsite(f"{refusal.op} (called by the compiled graph {graph}, a fallback kernel "
                         f"of inductor's) cannot be captured: {refusal.cause.why}",
                         current_callsite())
    error = cuda_errors.capture_refused(refusal.cause.cuda_text, detail, op=refusal.op)
    if refusal.cause.invalidates and state.capture is not None:
        state.capture.invalidate(error)
    state.refuse(error)
