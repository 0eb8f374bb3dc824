"""Users' Triton kernels launched on the emulated CUDA device: run through Triton's interpreter, as
one device op on the current stream.

Runtimes launch `@triton.jit` kernels of their own on "cuda" tensors (nano-vllm's store_kvcache,
vLLM's and SGLang's kernels); on the emulated device those tensors are host memory, which a
compiled Triton kernel cannot read, and the CUDA wheel's triton on a machine without a GPU finds no
driver. While the emulation lasts, `JITFunction.run` (what `kernel[grid](...)` calls, and through
it `triton.heuristics`' and `triton.autotune`'s wrappers; `InterpretedFunction.run` under
TRITON_INTERPRET=1) sends a launch whose tensor arguments are device memory here instead; any other
launch goes to triton as before.

A launch is one call of a custom op made for the kernel, `harness_triton::<kernel name>(Tensor(a!)[]
written, Tensor[] read, int launch) -> ()`: the tensors the kernel may write (triton_writes.py reads
them off its source), those it only reads, and the number of the launch's record, which holds
everything else CUDA freezes at launch: the grid (a callable grid evaluated then), the Python
scalars and constexprs, the layout of tuples and descriptors. So the device's layers see it as they
see any op: the placement mode issues it to the current stream, the stream tracking checks its
reads and writes (a race with another stream, no race between two kernels that only read a
tensor), the adversarial schedule may queue it, a profiler records it as a kernel named after the
Triton kernel. The op's kernel runs the Triton kernel through the interpreter
(triton_interpreter.py) on the tensors it is given.

Inside a capture the recorder records the op, not run (as CUDA records a kernel node), and each
replay calls it on the recorder's aliases of the captured memory with the same record: the
captured addresses and the arguments as they were at capture, whatever the Python variables hold
at replay. A record is dropped once its eager launch ran; a captured launch's record lives as long
as the emulation's state (a replay after the emulation ended finds none and says so).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import threading
from dataclasses import dataclass
from typing import Any

import torch

from harness import torch_internals, triton_internals
from harness.emulation.active import active_state
from harness.emulation.device_memory import is_device_memory
from harness.emulation.triton_autotune import autotuner_run
from harness.emulation.triton_interpreter import call_helper, interpreting, run_grid
from harness.emulation.triton_writes import written_parameters
from harness.graphs.emulator.graph import replaying

NAMESPACE = "harness_triton"
_SCHEMA = "(Tensor(a!)[] written, Tensor[] read, int launch) -> ()"


# --- a launch's record -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Slot:
    """Where a tensor argument stands: its index in the op's written or read list."""

    written: bool
    index: int


@dataclass(frozen=True)
class _Reinterpreted:
    """`triton.reinterpret(tensor, dtype)`: the tensor's slot and the dtype it is read as."""

    slot: _Slot
    dtype: Any


@dataclass(frozen=True)
class _Described:
    """A host-made tensor descriptor: its base tensor's slot and the rest of its fields."""

    kind: type
    base: Any
    fields: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Launch:
    """One launch as CUDA freezes it: the kernel, the grid, every argument by parameter name
    (tensors by slot), and whether a capture recorded it (kept for its replays)."""

    kernel: Any
    grid: tuple[int, int, int]
    arguments: tuple[tuple[str, Any], ...]
    kept: bool

    def bound(self, written: list[torch.Tensor], read: list[torch.Tensor]) -> dict[str, Any]:
        """The arguments, each slot filled from the tensors the op was called with."""
        return {name: _filled(value, written, read) for name, value in self.arguments}


class LaunchTable:
    """The records of the launches issued while the emulation lasts, by number."""

    def __init__(self) -> None:
        self._records: dict[int, Launch] = {}
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()

    def add(self, launch: Launch) -> int:
        with self._lock:
            number = next(self._numbers)
            self._records[number] = launch
        return number

    def take(self, number: int) -> Launch:
        """The record of launch `number`; an eager launch's is dropped as it runs."""
        with self._lock:
            launch = self._records.get(number)
            if launch is not None and not launch.kept:
                del self._records[number]
        if launch is None:
            raise RuntimeError(f"Triton launch {number} has no record on the emulated CUDA device: "
                               f"it ran already, or the graph that captured it was made in "
                               f"another emulate_cuda() than the one replaying it")
        return launch

    def __len__(self) -> int:
        return len(self._records)


def _filled(value: Any, written: list, read: list) -> Any:
    if isinstance(value, _Slot):
        return (written if value.written else read)[value.index]
    if isinstance(value, _Reinterpreted):
        wrapper = triton_internals.get("TensorWrapper")
        return wrapper(_filled(value.slot, written, read), value.dtype)
    if isinstance(value, _Described):
        return value.kind(base=_filled(value.base, written, read), **dict(value.fields))
    if type(value) is tuple:
        return tuple(_filled(v, written, read) for v in value)
    return value


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def _slotted(value: Any, writes: bool, written: list, read: list, is_tensor=_is_tensor) -> Any:
    """`value` with each tensor in it (what `is_tensor` says is one: a torch tensor, or a compiled
    graph's value for one) replaced by its slot, the tensor appended to its list."""
    if is_tensor(value):
        into = written if writes else read
        into.append(value)
        return _Slot(writes, len(into) - 1)
    if isinstance(value, triton_internals.get("TensorWrapper")):
        return _Reinterpreted(_slotted(value.base, writes, written, read, is_tensor), value.dtype)
    if _is_descriptor(value):
        fields = tuple((name, getattr(value, name)) for name in _descriptor_fields(value))
        return _Described(type(value), _slotted(value.base, writes, written, read, is_tensor),
                          fields)
    if type(value) is tuple:
        return tuple(_slotted(v, writes, written, read, is_tensor) for v in value)
    return value


def _is_descriptor(value: Any) -> bool:
    # triton.tools.tensor_descriptor.TensorDescriptor, a dataclass whose `base` is the tensor
    return type(value).__name__ == "TensorDescriptor" and isinstance(
        getattr(value, "base", None), torch.Tensor)


def _descriptor_fields(value: Any) -> list[str]:
    return [name for name in inspect.signature(type(value)).parameters if name != "base"]


def _tensors(value: Any):
    """Every tensor in a kernel argument (tuples, reinterpreted tensors, descriptors)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif type(value) is tuple:
        for v in value:
            yield from _tensors(v)
    elif hasattr(value, "base") and isinstance(value.base, torch.Tensor):
        yield value.base


# --- the op ------------------------------------------------------------------------------------


class _Ops:
    """The op of each kernel launched so far, in one library for the process (an op cannot be
    defined twice, and a kernel outlives the emulation it was first launched in)."""

    def __init__(self) -> None:
        self._library = None
        self._ops: dict[Any, Any] = {}
        self._names: set[str] = set()
        self._lock = threading.Lock()

    def of(self, kernel: Any) -> Any:
        """The op of `kernel`'s function (one op however often it is jitted: the launch's record
        says which kernel object runs)."""
        with self._lock:
            op = self._ops.get(kernel.fn)
            if op is None:
                op = self._ops[kernel.fn] = self._define(kernel)
            return op

    def _define(self, kernel: Any) -> Any:
        if self._library is None:
            self._library = torch.library.Library(NAMESPACE, "FRAGMENT")
        base = getattr(kernel.fn, "__name__", "kernel")
        name = base if base.isidentifier() else "kernel"
        number = 1
        while name in self._names:
            number += 1
            name = f"{base}_{number}"
        self._names.add(name)
        self._library.define(name + _SCHEMA)
        self._library.impl(name, _run, "CPU")
        self._library.impl(name, _run_meta, "Meta")
        return getattr(getattr(torch.ops, NAMESPACE), name).default


_OPS = _Ops()


def _run(written: list[torch.Tensor], read: list[torch.Tensor], launch: int) -> None:
    """The op's kernel: the launch's Triton kernel through the interpreter."""
    record = active_state().triton_launches.take(launch)
    _run_grid_without_dynamo()(record.kernel, record.grid, record.bound(written, read))


@functools.cache
def _run_grid_without_dynamo():
    """`run_grid` with dynamo's frame callback off while it runs (made at the first launch, as
    `torch.compiler.disable` imports dynamo). A launch that dynamo leaves out of a compiled
    function's graph (a graph break: an autotuner config with a `pre_hook`, which dynamo does not
    trace) runs eagerly inside dynamo's callback, which offers every new Python frame for
    compiling; the device's own modules are skipped (compiled_graphs.keep_dynamo_out), but the
    frames of Triton's interpreter they call were not, and dynamo failed inside them. On CUDA
    those frames would be a compiled kernel's launch, no Python at all."""
    return torch.compiler.disable(run_grid)


def _run_meta(written: list[torch.Tensor], read: list[torch.Tensor], launch: int) -> None:
    """Shapes only: the kernel changes none."""


# --- launching ---------------------------------------------------------------------------------


def on_device(args: tuple, kwargs: dict) -> bool:
    """Whether a launch is the emulated device's to run: its arguments hold device memory, or it
    is met while a graph replays (inside a recorded custom op's body, a `torch.library.triton_op`
    or a compiled graph, whose tensors are the replay's aliases of captured memory, which carry
    no device mark: a launch there went to triton's driver and failed)."""
    return replaying() or any(is_device_memory(t) for value in (*args, *kwargs.values())
                              for t in _tensors(value))


def _bind(kernel: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The kernel's arguments by parameter name, defaults filled in; launch options (num_warps,
    num_stages, ...) are the compiler's, which the interpreter has none of."""
    signature = inspect.signature(kernel.fn)
    own = {k: v for k, v in kwargs.items() if k in signature.parameters}
    bound = signature.bind(*args, **own)
    bound.apply_defaults()
    return dict(bound.arguments)


def _grid(grid: Any, bound: dict[str, Any]) -> tuple[int, int, int]:
    if callable(grid):
        grid = grid(bound)
    if isinstance(grid, int):
        grid = (grid,)
    sizes = tuple(int(g) for g in grid)
    if not 1 <= len(sizes) <= 3:
        raise ValueError(f"a Triton grid has 1 to 3 dimensions; got {grid!r}")
    return sizes + (1,) * (3 - len(sizes))


def launch(state, kernel: Any, args: tuple, kwargs: dict, grid: Any) -> None:
    """`kernel[grid](*args, **kwargs)` on the emulated device: one device op on the current
    stream, recorded when a capture is under way."""
    for hook in kernel.pre_run_hooks:
        hook(*args, **kwargs)
    bound = _bind(kernel, args, kwargs)
    sizes = _grid(grid, bound)
    if 0 in sizes:
        return  # Triton's launcher launches nothing for an empty grid
    written, read, number = _recorded(state, kernel, bound, sizes, kept=state.capturing())
    # Below autograd, as CUDA's launch never reaches autograd: no in-place checks, no version
    # counter bumped, whatever tensors (inference tensors, leaves that require grad) it writes.
    with torch_internals.AutoDispatchBelowADInplaceOrView():
        _OPS.of(kernel)(written, read, number)


def _recorded(state, kernel: Any, bound: dict[str, Any], sizes: tuple[int, int, int], *,
              kept: bool, is_tensor=_is_tensor) -> tuple[list, list, int]:
    """The tensors a launch writes and reads, and the number of its record in the device's table
    (`kept` for every run of a capture's or a compiled graph's launch)."""
    writes = written_parameters(kernel.fn)
    written: list[Any] = []
    read: list[Any] = []
    arguments = tuple((name, _slotted(value, writes is None or name in writes, written, read,
                                      is_tensor))
                      for name, value in bound.items())
    return written, read, state.triton_launches.add(Launch(kernel, sizes, arguments, kept=kept))


def graph_launch(state, kernel: Any, arguments: dict[str, Any], grid: tuple,
                 is_tensor) -> tuple[Any, list, list, int]:
    """A launch a compiled graph makes (dynamo traced `kernel[grid](...)`): the kernel's op, the
    arguments it writes and reads (the graph's values, those `is_tensor` says are tensors), and
    the number of the launch's record, kept for every call of the graph. An autotuner takes its
    first config."""
    if isinstance(kernel, triton_internals.get("Autotuner")):
        arguments = {**arguments, **kernel.configs[0].kwargs}
        kernel = kernel.fn
    bound = _bind(kernel, (), arguments)
    written, read, number = _recorded(state, kernel, bound, _grid(grid, bound), kept=True,
                                      is_tensor=is_tensor)
    return _OPS.of(kernel), written, read, number


# --- what the emulation puts in place -----------------------------------------------------------


def _jit_run(state, original):
    def run(self, *args, grid, warmup, **kwargs):
        if not on_device(args, kwargs):
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        if warmup:
            return None  # nothing to compile: the interpreter runs the kernel's Python
        launch(state, self, args, kwargs, grid)
        return None

    run.__wrapped__ = original
    return run


def _jit_call(original):
    def call(self, *args, **kwargs):
        if interpreting():
            return call_helper(self, args, kwargs)
        return original(self, *args, **kwargs)

    call.__wrapped__ = original
    return call


def patches(state) -> list[tuple[Any, str, Any]]:
    """`JITFunction.run` and `__call__`, `InterpretedFunction.run` (what `triton.jit` makes under
    TRITON_INTERPRET=1, whose own launcher would run the kernel at once, untracked and uncaptured),
    and `Autotuner.run` (triton_autotune.py), where triton is installed; nothing on a torch without
    triton. Where this triton lacks a private name the interpreter path needs, the `run` methods
    instead refuse a launch on device memory with the error naming what is missing (a launch on
    host tensors goes to triton as before), and the emulation enters all the same."""
    if not triton_internals.installed():
        return []
    found = triton_internals.problems()
    if found:
        return _refusals(triton_internals.unusable_error(found))
    jit_function = triton_internals.get("JITFunction")
    interpreted = triton_internals.get("InterpretedFunction")
    autotuner = triton_internals.get("Autotuner")
    return [(jit_function, "run", _jit_run(state, jit_function.__dict__["run"])),
            (jit_function, "__call__", _jit_call(jit_function.__dict__["__call__"])),
            (interpreted, "run", _jit_run(state, interpreted.__dict__["run"])),
            (autotuner, "run", autotuner_run(autotuner.__dict__["run"], on_device))]


def _refusals(error: Exception) -> list[tuple[Any, str, Any]]:
    found = []
    for name in ("JITFunction", "InterpretedFunction", "Autotuner"):
        try:
            cls = triton_internals.get(name)
        except (AttributeError, ImportError):
            continue
        if "run" in cls.__dict__:
            found.append((cls, "run", _refused_run(cls.__dict__["run"], error)))
    return found


def _refused_run(original, error: Exception):
    def run(self, *args, **kwargs):
        if on_device(args, kwargs):
            raise error
        return original(self, *args, **kwargs)

    run.__wrapped__ = original
    return run


__all__ = ["Launch", "LaunchTable", "NAMESPACE", "graph_launch", "launch", "on_device", "patches"]
