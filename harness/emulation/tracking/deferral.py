"""A device op queued instead of run (the adversarial schedule): its results are allocated now,
shaped by its meta kernel (as the recorder allocates a captured op's) and poisoned until it runs,
so anything that reads them before the stream got to them sees NaN or an extreme int, every time."""

from __future__ import annotations

from typing import Any, Callable

import torch

from harness import torch_internals
from harness.graphs.emulator import opinfo
from harness.graphs.emulator.opinfo import OpKind
from harness.graphs.emulator.pool import poison_value
from harness.graphs.emulator.shapes import result_shapes
from harness.emulation.tracking.queued_shapes import flat_tensors, map_tensors


def _poisoned_like(meta: torch.Tensor) -> torch.Tensor:
    out = torch.empty_strided(meta.size(), meta.stride(), dtype=meta.dtype)
    if out.numel():
        out.fill_(poison_value(meta.dtype))
    return out


def can_defer(kind: OpKind) -> bool:
    return kind in (OpKind.MUTATING, OpKind.FUNCTIONAL)


def _as_issued(call: Callable[[], Any]) -> Callable[[], None]:
    """`call` run later as it would have run when issued: below autograd and autocast (the mode
    met it there: an autocast the host entered since does not recast a launched kernel), in the
    inference mode of the moment it was issued."""
    inference = torch.is_inference_mode_enabled()

    def run() -> None:
        with torch.inference_mode(inference), torch_internals.AutoDispatchBelowADInplaceOrView():
            if torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"):
                _without_autocast(call)
            else:
                call()

    return run


def _without_autocast(call: Callable[[], Any]) -> Any:
    before = (torch.is_autocast_enabled("cpu"), torch.is_autocast_enabled("cuda"))
    torch.set_autocast_enabled("cpu", False)
    torch.set_autocast_enabled("cuda", False)
    try:
        return call()
    finally:
        torch.set_autocast_enabled("cpu", before[0])
        torch.set_autocast_enabled("cuda", before[1])


def defer(func, args: tuple, kwargs: dict, kind: OpKind, held: tuple = (),
          shapes: Callable[[Any, tuple, dict], Any] = result_shapes
          ) -> tuple[Any, Callable[[], None]]:
    """(what the op returns now, the call that does its work later). `held` is `(args, kwargs)`
    with the tensors the queued call keeps instead of the caller's (aliases of the same memory);
    `shapes` gives the op's results as meta tensors (queued_shapes.ResultShapes keeps them)."""
    returns_from = (args, kwargs)
    args, kwargs = held or (args, kwargs)
    if kind is OpKind.MUTATING:
        return opinfo.aliased_returns(func, *returns_from), _as_issued(lambda: func(*args, **kwargs))
    outputs = map_tensors(_poisoned_like, shapes(func, *returns_from))
    # The queued call writes the results' memory, as a queued kernel does, without holding the
    # tensors handed out: a second reference to a gradient made it clone where CUDA's
    # AccumulateGrad steals it (it reads the tensor's use count).
    targets = [t.detach() for t in flat_tensors(outputs)]

    def run() -> None:
        results = flat_tensors(func(*args, **kwargs))
        for dst, src in zip(targets, results):
            if dst.shape == src.shape:
                dst.copy_(src)
            elif dst.numel() and src.numel():
                raise RuntimeError(f"{opinfo.op_name(func)} ran late with a result of shape "
                                   f"{tuple(src.shape)}, where its meta kernel gave "
                                   f"{tuple(dst.shape)}: the adversarial schedule cannot defer it")
            # else: an empty placeholder result (batch norm's saved statistics in eval mode)

    return outputs, _as_issued(run)


_DisableTorchDispatch = torch_internals.DisableTorchDispatch
_DisableTorchFunction = torch_internals.DisableTorchFunction
_BelowAutograd = torch_internals.AutoDispatchBelowADInplaceOrView
_inference_on = torch.is_inference_mode_enabled
_autocast_on = torch.is_autocast_enabled
_any_autocast_on = torch_internals.is_any_autocast_enabled  # no device type to parse
_deterministic = torch_internals.deterministic_algorithms
_default_dtype = torch.get_default_dtype


def out_form(op: Any) -> Any:
    """The `out=` overload of the aten overload `op` (opinfo.out_overload: the same arguments, an
    out that is filled as it is) whose arguments come in `op`'s order and whose one out is named
    `out`, or None: what a queued call whose aten op got the call's own positional arguments runs
    into its poisoned result (no second allocation and copy)."""
    overload = opinfo.out_overload(op)
    if overload is None or opinfo.out_names(overload) != ["out"]:
        return None
    names = [a.name for a in op._schema.arguments]
    theirs = [a.name for a in overload._schema.arguments if not a.is_out]
    return overload if theirs[:len(names)] == names else None


class QueuedCall:
    """A whole torch call queued as the one device op it makes (a learned call pattern,
    call_patterns.py): run later below autograd, with every mode off, in the inference mode and
    the dispatch state of its issue (no autocast, deterministic algorithms off, the default dtype
    then), which is what the aten op it reaches would have seen; its fresh result copied into
    `target`, or written there by `out_op` (the aten op's `out=` form, where the op was given the
    call's arguments as they are). One object, not a closure per part: a decode step queues
    hundreds."""

    __slots__ = ("func", "args", "kwargs", "target", "inference", "dtype", "release", "out_op")

    def __call__(self) -> None:
        if _inference_on() is self.inference:
            self._run()
        else:  # entered first: the inference mode's guard resets what autograd's excludes
            with torch.inference_mode(self.inference):
                self._run()
        if self.release is not None:
            self.release()

    def _run(self) -> None:
        with _DisableTorchDispatch(), _DisableTorchFunction(), _BelowAutograd():
            in_issue_state = (_default_dtype() is self.dtype and not _deterministic()
                              and not (_any_autocast_on() and (_autocast_on("cpu")
                                                               or _autocast_on("cuda"))))
            if self.out_op is not None:
                if in_issue_state:
                    self.out_op(*self.args, out=self.target)
                else:
                    _in_issue_state(self.dtype, self.out_op, self.args, {"out": self.target})
                return
            if in_issue_state:
                result = self.func(*self.args, **self.kwargs)
            else:
                result = _in_issue_state(self.dtype, self.func, self.args, self.kwargs)
            target = self.target
            if target is not None:
                if not isinstance(result, torch.Tensor) or result.shape != target.shape:
                    raise RuntimeError(
                        f"{getattr(self.func, '__name__', self.func)} ran late with a result of "
                        f"shape {tuple(getattr(result, 'shape', ()))}, where its issue gave "
                        f"{tuple(target.shape)}: the adversarial schedule cannot defer it")
                target.copy_(result)


def _in_issue_state(dtype: torch.dtype, func, args: tuple, kwargs: dict) -> Any:
    """`func(*args, **kwargs)` with autocast and deterministic algorithms off and `dtype` the
    default, as when it was issued (the host changed them before the queue ran)."""
    before = (_default_dtype(), _autocast_on("cpu"), _autocast_on("cuda"), _deterministic(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    torch.set_default_dtype(dtype)
    torch.set_autocast_enabled("cpu", False)
    torch.set_autocast_enabled("cuda", False)
    torch.use_deterministic_algorithms(False)
    try:
        return func(*args, **kwargs)
    finally:
        torch.set_default_dtype(before[0])
        torch.set_autocast_enabled("cpu", before[1])
        torch.set_autocast_enabled("cuda", before[2])
        torch.use_deterministic_algorithms(before[3], warn_only=before[4])


def full_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of `torch.full(shape, ...)` (and `torch.empty(shape)`): row-major, a size of
    0 counted as 1 (c10's contiguous strides)."""
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def defer_call(func, held: tuple, result: tuple | None, returns: Any, out_op: Any = None
               ) -> tuple[Any, QueuedCall]:
    """(what a learned torch call returns now, the call that does its work later), called with
    torch function and dispatch handling off (DisableTorchFunction, DisableTorchDispatch: the
    result is made so). `held` is `(args, kwargs)` with the tensors the queued call keeps
    (aliases of the caller's); `result`: the fresh result's (shape, stride, dtype, poison value
    or None when it is empty, whether `stride` is the one `torch.full` gives `shape`),
    allocated now and poisoned until the call ran, or None for a call in place, which returns
    `returns`. `out_op`: the `out=` form that writes the result from `held`'s arguments (None:
    the call runs and its result is copied)."""
    call = QueuedCall()
    call.func, (call.args, call.kwargs) = func, held
    call.inference, call.dtype, call.release = _inference_on(), _default_dtype(), None
    if result is None:
        call.target = call.out_op = None
        return returns, call
    call.out_op = out_op
    shape, stride, dtype, poison, dense = result
    if dense and poison is not None:
        out = torch.full(shape, poison, dtype=dtype)  # empty_strided and fill_ in one call
    else:
        out = torch.empty_strided(shape, stride, dtype=dtype)
        if poison is not None:
            out.fill_(poison)
    call.target = out.detach()
    return out, call
