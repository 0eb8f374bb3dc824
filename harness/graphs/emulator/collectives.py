"""Collectives in a graph, as NCCL has them: capture records the collective without running it,
and each replay runs it at its place, to completion, so every later op sees its result (on CUDA the
graph orders the collective's kernel before the ops after it on the capturing stream).

Both APIs of torch.distributed reach the dispatcher: the ProcessGroup API as `c10d::*_` ops that
return a `Work`, functional collectives as `_c10d_functional::*` ops whose results are waited for
with `wait_tensor`. A collective the capture never waits for (`Work.wait()` never called, a result
never passed to `wait_tensor`) is work forked off the capturing stream and never joined back:
CUDA ends such a capture with its unjoined-work error, and so does the emulator.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from harness.torch_internals import tree_flatten
from harness.graphs.base import CaptureError
from harness.graphs.emulator.callsite import at_callsite, current_callsite

PROCESS_GROUP_NAMESPACE = "c10d"
FUNCTIONAL_NAMESPACE = "_c10d_functional"
_WAIT_TENSOR = "wait_tensor"
_PASS_THROUGH = {"_wrap_tensor_autograd"}  # autograd bookkeeping around a functional result


def is_collective(func: Any) -> bool:
    return func.namespace in (PROCESS_GROUP_NAMESPACE, FUNCTIONAL_NAMESPACE)


class CapturedWork(dist.Work):
    """What `dist.all_reduce(..., async_op=True)` returns during capture: the collective is only
    recorded, so waiting on it joins the capture and returns at once."""

    def __init__(self, op: str, where: str) -> None:
        super().__init__()
        self.op = op
        self.where = where
        self.waited = False

    def wait(self, timeout: Any = None) -> bool:
        self.waited = True
        return True

    def is_completed(self) -> bool:
        return self.waited

    def is_success(self) -> bool:
        return True


def run_process_group_collective(op, args, kwargs) -> None:
    """Replay of a `c10d::*_` op: run it and wait for its Work before the next recorded op."""
    result = op(*args, **kwargs)
    work = result[-1] if isinstance(result, (tuple, list)) else result
    if work is not None:
        work.wait()


def run_functional_collective(op, args, kwargs, outs) -> None:
    """Replay of a functional collective: run it, wait for it, copy its results into the outputs."""
    results = [r for r in tree_flatten(op(*args, **kwargs))[0] if isinstance(r, torch.Tensor)]
    for dst, src in zip(outs, results):
        dst.copy_(torch.ops._c10d_functional.wait_tensor(src))


def run_inplace_functional_collective(op, args, kwargs) -> None:
    for result in tree_flatten(op(*args, **kwargs))[0]:
        if isinstance(result, torch.Tensor):
            torch.ops._c10d_functional.wait_tensor(result)


def _same_type_argument(func, return_type: Any, args, kwargs) -> Any:
    """The first argument of a `c10d::*_` op typed like one of its tensor returns: these ops hand
    back the tensors they wrote (`allreduce_` its `tensors`, `allgather_` its `output_tensors`)."""
    from harness.graphs.emulator import opinfo

    named = opinfo.bind(func, args, kwargs)
    for argument in func._schema.arguments:
        if str(argument.type) == str(return_type):
            return named[argument.name]
    raise CaptureError(f"{opinfo.op_name(func)}: no argument of type {return_type} to return "
                       f"during capture", op=opinfo.op_name(func))


class PendingCollectives:
    """The collectives one capture recorded and has not yet waited for."""

    def __init__(self) -> None:
        self._works: list[CapturedWork] = []
        self._results: dict[int, tuple[str, str]] = {}  # storage data pointer -> (op, line)

    def process_group_returns(self, func, args, kwargs) -> Any:
        """What a `c10d::*_` op returns during capture, with a `CapturedWork` for its Work."""
        from harness.graphs.emulator import opinfo

        work = CapturedWork(opinfo.op_name(func), current_callsite())
        self._works.append(work)
        returns = []
        for ret in func._schema.returns:
            if "Work" in str(ret.type):
                returns.append(work.boxed())
            else:
                returns.append(_same_type_argument(func, ret.type, args, kwargs))
        return returns[0] if len(returns) == 1 else tuple(returns)

    def functional_result(self, func, result: Any) -> None:
        from harness.graphs.emulator import opinfo

        for t in tree_flatten(result)[0]:
            if isinstance(t, torch.Tensor):
                self._results[t.untyped_storage().data_ptr()] = (opinfo.op_name(func), current_callsite())

    def waited(self, tensor: torch.Tensor) -> None:
        self._results.pop(tensor.untyped_storage().data_ptr(), None)

    def unjoined_error(self) -> CaptureError | None:
        """CUDA's error for a capture that ends with collective work never joined back."""
        pending = [(w.op, w.where, "Work.wait()") for w in self._works if not w.waited]
        pending += [(op, where, "wait_tensor()") for op, where in self._results.values()]
        if not pending:
            return None
        op, where, remedy = pending[0]
        return CaptureError(at_callsite(
            f"capture ended with {len(pending)} collective(s) never waited for, first {op}: on "
            f"CUDA a collective runs on the communicator's stream, forked off the capturing "
            f"stream, and a capture that ends before it is joined back fails with "
            f"cudaErrorStreamCaptureUnjoined (operation not permitted: capture ended with unjoined "
            f"work); call {remedy} on it inside the captured code", where), op=op)


def waits_on_subclass(types: Any) -> bool:
    """Whether an op's arguments include a functional collective's result not yet waited for
    (`AsyncCollectiveTensor`): it waits in its own `__torch_dispatch__`, which must run first."""
    return any(t.__name__ == "AsyncCollectiveTensor" for t in types)


def is_wait(func: Any) -> bool:
    return func.namespace == FUNCTIONAL_NAMESPACE and func._schema.name.endswith(_WAIT_TENSOR)


def is_pass_through(func: Any) -> bool:
    return func.namespace == FUNCTIONAL_NAMESPACE and func._schema.name.split("::")[-1] in _PASS_THROUGH
