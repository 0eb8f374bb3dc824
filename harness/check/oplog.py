"""Op streams to compare: each op of an eager run (a TorchDispatchMode that logs as it runs) or of
an observed emulated replay, with its callsite, its inputs as they were when it ran and its outputs
as it left them, and the comparison of two such ops within BF16 steps (harness.check.tolerance).

The eager log sees the op stream the emulator's recorder sees: views are not logged (they only
alias) and composite ops are decomposed, so a replay's records and an eager run of the same
callable line up op by op.

The copies the logs keep are the harness's, not the program's: they are made in host memory with
every mode out of the way, so no device accounts for them (a runtime that sizes its KV cache from
`torch.cuda.mem_get_info()` sees the memory it would see without the explanation), stream tracking
does not take them for the program's reads, and on a real GPU (the graph sanitizer) they leave the
device's memory alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from harness import torch_internals
from harness.torch_internals import TorchDispatchMode, disable_current_modes as _disable_current_modes, tree_flatten

from harness.torch_internals import TorchDispatchMode, tree_flatten
from harness.check.tolerance import bf16_step
from harness.graphs.emulator import opinfo
from harness.graphs.emulator.callsite import Frame, describe_frame, user_frames
from harness.graphs.emulator.opinfo import OpKind
from harness.graphs.emulator.trace import Argument, OpRecord, Origin


_THIS_FILE = (__file__,)
# The op log runs inside the program's ops: a line found from inside it (a race, a capture error)
# is the program's line beyond it (harness.graphs.emulator.callsite).
__harness_machinery__ = True


@dataclass(frozen=True)
class Value:
    """One input as an op saw it: a tensor's copy and the address it was read at, or a host value."""

    name: str
    value: Any
    address: int | None = None
    origin: Origin = Origin.HOST
    storage: int | None = None  # where the storage it was read from begins
    written: bool = False  # the op writes it: its contents before the op may be a mere destination
    allocated_at: str = ""  # eager only: where the `empty` that made it ran, when no op wrote it since


@dataclass(frozen=True)
class OpEvent:
    op: str
    frames: tuple[Frame, ...]
    inputs: tuple[Value, ...]
    outputs: tuple[torch.Tensor, ...]
    writes: int = 0  # how many of the outputs (the first ones) are arguments it wrote in place
    output_storages: tuple[int, ...] = ()  # where the outputs live in the run that made them

    @property
    def key(self) -> tuple[str, Frame | None]:
        """What aligns an eager op with a recorded one: the op and the line that issued it."""
        return self.op, self.frames[0] if self.frames else None

    def where(self) -> str:
        return describe_frame(self.frames[0]) if self.frames else "(no caller outside torch)"


def address(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()


def _copy(t: torch.Tensor) -> torch.Tensor:
    return host_copy(t)


def _has_memory(t: torch.Tensor) -> bool:
    """False for the meta and fake tensors of the recorder's shape inference, which the log sees
    pass by during a capture (and drops with the capture's other events)."""
    return not t.is_meta and not torch_internals.is_fake_tensor(t)


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values in host memory of the harness's own (the module's docstring)."""
    if not _has_memory(t):
        return t.detach().clone()
    with torch_internals.DisableTorchFunction(), _disable_current_modes():
        t = t.detach()
        return t.clone() if t.device.type == "cpu" else t.to("cpu", copy=True)


def storages(tensors) -> tuple[int, ...]:
    return tuple(t.untyped_storage().data_ptr() if _has_memory(t) else 0
                 for t in tensors if isinstance(t, torch.Tensor))


def snapshot(argument: Argument) -> Value:
    value = argument.value
    if isinstance(value, torch.Tensor):
        return Value(argument.name, _copy(value), address(value), argument.origin,
                     value.untyped_storage().data_ptr(), argument.written)
    return Value(argument.name, value, None, argument.origin)


def record_inputs(record: OpRecord) -> tuple[Value, ...]:
    return tuple(snapshot(a) for a in record.arguments)


def record_event(record: OpRecord, inputs: tuple[Value, ...]) -> OpEvent:
    return OpEvent(record.op, record.frames, inputs, tuple(_copy(t) for t in record.outputs),
                   output_storages=storages(record.outputs))


_UNINITIALIZED = frozenset({torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default,
                            torch.ops.aten.empty_strided.default, torch.ops.aten.new_empty.default})


def _eager_value(name: str, t: torch.Tensor, unwritten: dict[int, str]) -> Value:
    storage = t.untyped_storage().data_ptr()
    return Value(name, _copy(t), address(t), Origin.EXTERNAL, storage,
                 allocated_at=unwritten.get(storage, ""))


def _named_values(func, args, kwargs, unwritten: dict[int, str]) -> tuple[Value, ...]:
    values: list[Value] = []
    for name, value in opinfo.bind(func, args, kwargs).items():
        if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
            values.extend(_eager_value(f"{name}[{i}]", v, unwritten)
                          for i, v in enumerate(value) if isinstance(v, torch.Tensor))
        elif isinstance(value, torch.Tensor):
            values.append(_eager_value(name, value, unwritten))
        else:
            values.append(Value(name, value))
    return tuple(values)


class EagerOpLog(TorchDispatchMode):
    """Runs every op for real and logs it as an `OpEvent`. It also keeps the storages made by an
    `empty` op that no op has written since (storage -> where it was made): reading one is reading
    memory nothing computed, in the graph and eagerly alike. What an `empty` makes is zeroed."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[OpEvent] = []
        self._unwritten: dict[int, str] = {}
        self.paused = False  # ops run unlogged meanwhile (a graph's replay, logged from its records)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused:
            return func(*args, **kwargs)
        if opinfo.is_composite(func):
            with self:
                return func.decompose(*args, **kwargs)
        if opinfo.op_kind(func) is OpKind.VIEW:
            return func(*args, **kwargs)
        inputs = _named_values(func, args, kwargs, self._unwritten)
        result = func(*args, **kwargs)
        named = opinfo.bind(func, args, kwargs)
        written = [t for name in written_arguments(func) for t in tree_flatten(named.get(name))[0]
                   if isinstance(t, torch.Tensor)]
        fresh = ([] if opinfo.op_kind(func) is OpKind.MUTATING else
                 [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)])
        frames = user_frames(skip=_THIS_FILE)
        for t in written:
            self._unwritten.pop(t.untyped_storage().data_ptr(), None)
        if func in _UNINITIALIZED:
            for t in fresh:
                self._unwritten[t.untyped_storage().data_ptr()] = describe_frame(frames[0]) if frames else ""
                # Zeros, not leftover memory (an earlier graph's poison among it): the reference of
                # memory nothing wrote is the same on every run, and never the graph's poison.
                t.zero_()
            return result  # an allocation: nothing computed, and the recorder keeps no record of it
        self.events.append(OpEvent(opinfo.op_name(func), frames, inputs,
                                   tuple(_copy(t) for t in (*written, *fresh)), len(written),
                                   storages((*written, *fresh))))
        return result


def written_arguments(func) -> list[str]:
    """The names of the arguments an op writes, in schema order."""
    return [a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write]


def tensor_difference(expected: Any, actual: Any, steps: float) -> str | None:
    """How `actual` departs from `expected` beyond `steps` bf16 steps at `expected`'s scale (its
    largest finite magnitude), or None. Integers and booleans must be equal; a NaN must match a NaN."""
    if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
        return None if _same_host_value(expected, actual) else f"{actual!r} where eager has {expected!r}"
    if expected.shape != actual.shape:
        return f"shape {tuple(actual.shape)} where eager has {tuple(expected.shape)}"
    if expected.dtype != actual.dtype:
        return f"dtype {actual.dtype} where eager has {expected.dtype}"
    if expected.numel() == 0:
        return None
    if not (expected.dtype.is_floating_point or expected.dtype.is_complex):
        unequal = expected != actual
        count = int(unequal.sum())
        return None if count == 0 else f"{count} of {expected.numel()} elements differ (exact dtype)"
    e, a = expected.double(), actual.double()
    nan_mismatch = int((e.isnan() != a.isnan()).sum())
    if nan_mismatch:
        return f"{nan_mismatch} of {expected.numel()} elements are NaN on one side only"
    finite = e.isfinite() & a.isfinite()
    if bool((e[~finite] != a[~finite]).any()):
        return "an infinity on one side only"
    scale = float(e[finite].abs().max()) if bool(finite.any()) else 0.0
    tolerance = steps * bf16_step(scale)
    gap = (e - a).abs()[finite]
    worst = float(gap.max()) if gap.numel() else 0.0
    if worst <= tolerance:
        return None
    count = int((gap > tolerance).sum())
    return (f"max |diff| {worst:.4g} beyond {steps:g} bf16 steps ({tolerance:.3g} at scale "
            f"{scale:.4g}) in {count} of {expected.numel()} elements")


def _same_host_value(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except Exception:  # values without a plain ==: judged equal by their text
        return repr(a) == repr(b)


def output_difference(expected: OpEvent, actual: OpEvent, steps: float) -> str | None:
    if len(expected.outputs) != len(actual.outputs):
        return f"{len(actual.outputs)} outputs where eager has {len(expected.outputs)}"
    for i, (e, a) in enumerate(zip(expected.outputs, actual.outputs)):
        found = tensor_difference(e, a, steps)
        if found:
            return found if len(expected.outputs) == 1 else f"output {i}: {found}"
    return None
