"""Capture lint: run a callable once under the emulator's recorder and report every capture hazard
in one pass, each with its source line.

The emulator's capture stops at the first host sync. The lint does not: a refused op is recorded as
a hazard and run eagerly, and every recorded op is run for real as well, so values downstream are
the eager ones and data-dependent branches take the path they would take in eager mode. The callable
therefore runs once with its side effects, as an eager call would.

Hazards (any of them makes the report unclean):

- host sync: an op that reads device data on the host (`.item()`, `bool(t)`, `.tolist()`, ...)
- data-dependent shape: `nonzero`, `unique`, boolean-mask indexing, ...
- host copy: a copy between the host and the capture device; on a cpu device, a tensor built during
  capture without a device (a host tensor on CUDA) moved to the device or mixed with device tensors
- host data: a tensor built from Python data during capture (`torch.tensor([...])`), frozen into it
- random: a random op; it draws fresh values at every replay, not the eager ones. A draw from a
  `torch.Generator` of its own is no hazard once registered with the graph
  (`graph.register_generator_state(gen)`: pass it in `generators`, or the emulated CUDAGraph in
  `context`); unregistered, CUDA refuses the capture, and the lint says so
- refused: anything else capture refuses (a resize of recorded memory, ...)

Besides hazards the report lists external memory: tensors the graph reads but does not own, other
than parameters and buffers of modules reachable from the callable. They are not errors (static
input buffers and caches are external by design) but they are what a runtime must never rebind or
regrow: the candidates for a pointer move, to check with `snapshot_tensors`/`moved_tensors`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from harness.torch_internals import tree_flatten
from harness.graphs.emulator import opinfo
from harness.graphs.base import CaptureError
from harness.graphs.emulator.callsite import current_callsite, traceback_callsite
from harness.graphs.emulator.host_guard import wrapped_host_reads
from harness.graphs.emulator.host_tensors import HostTensors
from harness.graphs.emulator.opinfo import OpKind
from harness.graphs.emulator.pool import PoolArena, block_of
from harness.graphs.emulator.private_generators import (is_registered, private_generator,
                                                        unregistered_generator_error)
from harness.graphs.emulator.recorder import Recorder

HOST_SYNC = "host sync"
DYNAMIC_SHAPE = "data-dependent shape"
HOST_COPY = "host copy"
HOST_DATA = "host data"
RANDOM = "random"
REFUSED = "refused"
HAZARD_KINDS = (HOST_SYNC, DYNAMIC_SHAPE, HOST_COPY, HOST_DATA, RANDOM, REFUSED)

_RANDOM_OPS = frozenset({
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "bernoulli",
    "bernoulli_", "normal", "normal_", "uniform_", "exponential_", "geometric_", "cauchy_",
    "log_normal_", "multinomial", "native_dropout", "rrelu_with_noise", "poisson", "random_",
})
_LINT_FILE = (os.path.abspath(__file__),)  # besides torch and the emulator, which callsite skips


@dataclass(frozen=True)
class Hazard:
    kind: str
    op: str
    where: str
    detail: str
    count: int = 1

    def __str__(self) -> str:
        times = f" (x{self.count})" if self.count > 1 else ""
        return f"{self.kind}: {self.op}{times}: {self.detail}\n    at {self.where or '<unknown>'}"


@dataclass(frozen=True)
class ExternalRead:
    """A tensor the graph reads but does not own: `name` is its path from the callable where known."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    op: str
    where: str

    def __str__(self) -> str:
        return f"{self.name} {list(self.shape)} {self.dtype}: first read by {self.op}\n    at {self.where or '<unknown>'}"


@dataclass(frozen=True)
class LintReport:
    target: str
    hazards: list[Hazard]
    external: list[ExternalRead]
    stopped: str | None = None  # the exception that ended the run early, if any

    @property
    def clean(self) -> bool:
        return not self.hazards and self.stopped is None

    def kinds(self) -> set[str]:
        return {h.kind for h in self.hazards}

    def __str__(self) -> str:
        head = (f"capture lint of {self.target}: " +
                ("clean" if self.clean else f"{len(self.hazards)} hazard(s)") +
                f", {len(self.external)} external tensor(s) read")
        lines = [head]
        lines += [f"  {h}" for h in self.hazards]
        if self.stopped:
            lines.append(f"  stopped early: {self.stopped}")
        if self.external:
            lines.append("  external memory (pointer-move candidates: never rebind or regrow these):")
            lines += [f"    {e}" for e in self.external]
        return "\n".join(lines)


def capture_lint(fn: Callable[[], Any], *, context: tuple[Any, ...] = (), name: str | None = None,
                 device: torch.device | str | None = None,
                 generators: tuple[torch.Generator, ...] = ()) -> LintReport:
    """Lint `fn()` (see the module docstring). `context`: objects `fn` works on (a model, an engine);
    with what `fn` holds itself (its `__self__`, closure and defaults, two attributes deep), their
    modules' parameters and buffers are not reported as external memory, and their other tensors
    are named by path in the report (`Engine.metadata.positions`). `generators`: those the graph
    registers (`graph.register_generator_state`), besides any an emulated CUDAGraph in reach holds."""
    owners = _reachable(fn) + [obj for c in context for obj in [c, *_reachable_from(c)]]
    registered = tuple(generators) + tuple(g for o in owners for g in _registered_generators(o))
    device = torch.device(device) if device is not None else (_closure_device(fn) or _device_of(owners))
    exempt = {_storage(t) for m in owners if isinstance(m, nn.Module)
              for t in [*m.parameters(), *m.buffers()]}
    names = _tensor_names(owners)
    stopped = None
    emulated = _emulated_device(device)
    if emulated is not None:
        # The emulated CUDA device: its memory lives on the cpu, its registry says what is device
        # memory, and the device reports what it refuses (copies) to the lint instead of raising.
        recorder = _LintRecorder(PoolArena(emulated.storage_device), emulated.storage_device,
                                 exempt, names, memory=emulated.memory, kernel_device=device)
        host_tensors = _device_reports_to(emulated, recorder)
    else:
        recorder = _LintRecorder(PoolArena(device), device, exempt, names)
        # On a cpu device host and device tensors share memory; HostTensors tells them apart.
        host_tensors = HostTensors(report=lambda op, message: recorder.hazard(HOST_COPY, op, message)) \
            if device.type == "cpu" else contextlib.nullcontext()
    recorder.registered_generators = registered
    with torch.inference_mode(torch.is_inference_mode_enabled()), _host_reads_recorded(recorder), \
            host_tensors, recorder:
        try:
            fn()
        except Exception as error:  # the hazards so far still stand
            stopped = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}" \
                      f" (at {traceback_callsite(error.__traceback__, also_skip=_LINT_FILE)})"
    return LintReport(name or getattr(fn, "__qualname__", repr(fn)), recorder.hazard_list(),
                      recorder.external_reads, stopped)


class TargetFailed(Exception):
    """The lint target raised while being imported or built: its own error, not a capture hazard.
    The message names the file and line that raised."""


def lint_target(target: str, *, factory: bool = False) -> LintReport:
    """`MODULE:CALLABLE` imported and linted; with `factory`, CALLABLE() builds the callable to lint."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"lint target {target!r} must be MODULE:CALLABLE, e.g. mypkg.steps:decode_step")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name:
            raise TargetFailed(_raised_where(error, f"importing {module_name}")) from error
        raise
    except Exception as error:
        raise TargetFailed(_raised_where(error, f"importing {module_name}")) from error
    for part in attr.split("."):
        obj = getattr(obj, part)
    if factory:
        try:
            obj = obj()
        except Exception as error:
            raise TargetFailed(_raised_where(error, f"calling {target}()")) from error
    if not callable(obj):
        raise ValueError(f"{target}{'()' if factory else ''} is a {type(obj).__name__}, not a callable")
    return capture_lint(obj, name=target)


def _raised_where(error: BaseException, doing: str) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "<unknown>"
    return f"{doing}: {type(error).__name__}: {error} (raised at {where})"


def _emulated_device(device: torch.device):
    """The emulated CUDA device's state when `device` is one of its devices, else None."""
    from harness.emulation import emulation_active
    from harness.emulation.session import active_state

    return active_state() if device.type == "cuda" and emulation_active() == "cpu" else None


@contextlib.contextmanager
def _device_reports_to(state, recorder: "_LintRecorder"):
    def report(op: str, message: str) -> None:
        recorder.hazard(HOST_COPY if "cop" in message else REFUSED, op, message.split(" (at ")[0])

    state.reporter = report
    try:
        yield
    finally:
        state.reporter = None


class _LintRecorder(Recorder):
    def __init__(self, arena: PoolArena, device: torch.device, exempt: set[int], names: dict[int, str],
                 memory=None, kernel_device: torch.device | None = None) -> None:
        super().__init__(arena, device, memory, kernel_device)
        self._hazards: dict[tuple[str, str, str], Hazard] = {}
        self._exempt = exempt
        self._names = names
        self._lifted: set[int] = set()
        self._seen_external: set[int] = set()
        self._arenas: dict[torch.device, PoolArena] = {}
        self.external_reads: list[ExternalRead] = []

    def hazard(self, kind: str, op: str, detail: str, where: str | None = None) -> None:
        where = _callsite() if where is None else where
        key = (kind, op, where)
        found = self._hazards.get(key)
        self._hazards[key] = Hazard(kind, op, where, detail, 1 if found is None else found.count + 1)

    def hazard_list(self) -> list[Hazard]:
        return list(self._hazards.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = opinfo.op_name(func)
        if func in (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default):
            self.hazard(HOST_DATA, name, "a tensor built from Python data at capture: replay keeps "
                                         "these values; copy new ones into a static buffer instead")
            self._lifted.add(_storage(args[0]))
        self._note_external(func, args, kwargs)
        reason = opinfo.sync_reason(func, args, kwargs)
        copy = opinfo.copy_reason(func, args, kwargs, self.device, self.memory)
        if reason or copy:
            kind = HOST_COPY if copy else (HOST_SYNC if "sync" in reason else DYNAMIC_SHAPE)
            self.hazard(kind, name, reason or copy)
            return func(*args, **kwargs)  # eagerly, unrecorded: the run goes on with the true value
        if func.overloadpacket.__name__ in _RANDOM_OPS:
            self._random_hazard(func, name, kwargs)
        if opinfo.is_composite(func):
            return super().__torch_dispatch__(func, types, args, kwargs)
        try:
            result = super().__torch_dispatch__(func, types, args, kwargs)
        except CaptureError as error:
            self.hazard(REFUSED, name, str(error).split(" (at ")[0])
            return func(*args, **kwargs)
        kind = opinfo.op_kind(func)
        if kind is OpKind.VIEW:
            return result  # the recorder ran it already
        real = func(*args, **kwargs)
        if kind is not OpKind.MUTATING:
            for out, value in zip(tree_flatten(result)[0], tree_flatten(real)[0]):
                if isinstance(out, torch.Tensor) and isinstance(value, torch.Tensor) and out is not value:
                    out.copy_(value)
        return result

    def _random_hazard(self, func, name: str, kwargs: dict) -> None:
        generator = private_generator(kwargs, self.device)
        if generator is None:
            self.hazard(RANDOM, name, "draws fresh values at every replay; eager and graph runs differ")
        elif not is_registered(generator, self.registered_generators):
            self.hazard(RANDOM, name, str(unregistered_generator_error(func, generator)).split(" (at ")[0])

    def _check_generator(self, func, kwargs) -> None:
        pass  # reported by _random_hazard, and the run goes on

    def _allocate(self, meta: torch.Tensor, device: torch.device) -> torch.Tensor:
        # The lint guesses its device from what the callable holds; an op whose results land on
        # another device (a sampler over cuda logits the callable does not hold) gets a pool there.
        device = torch.device(device)
        if self.memory.all_device and device != self.arena.device:
            if device.type == "cuda" and device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            if device != self.arena.device:
                arena = self._arenas.get(device)
                if arena is None:
                    arena = self._arenas[device] = PoolArena(device)
                self.arena, saved = arena, self.arena
                try:
                    return super()._allocate(meta, device)
                finally:
                    self.arena = saved
        return super()._allocate(meta, device)

    def _lift_host_data(self, t: torch.Tensor) -> torch.Tensor:
        # Reported as a HOST_DATA hazard already; neither the capture's warning nor its refusal.
        return t

    def _note_external(self, func, args, kwargs) -> None:
        for t in tree_flatten((args, kwargs))[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta" or t.numel() == 0 \
                    or block_of(t) is not None:
                continue
            storage = _storage(t)
            if storage in self._exempt or storage in self._lifted or storage in self._seen_external:
                continue
            if t.dim() == 0 and not self.memory.all_device and not self.memory.is_device(t):
                continue  # a host scalar argument, passed by value
            self._seen_external.add(storage)
            self.external_reads.append(ExternalRead(self._names.get(t.data_ptr(), "<unnamed tensor>"), tuple(t.shape),
                                              str(t.dtype), opinfo.op_name(func), _callsite()))


def _host_reads_recorded(recorder: _LintRecorder) -> contextlib.AbstractContextManager[None]:
    """Host reads that skip the dispatcher on CPU: record them, then let them run."""

    def guarded(name: str, original: Callable) -> Callable:
        @functools.wraps(original)
        def read(self: torch.Tensor, *args, **kwargs):
            on_device = (self.device.type == recorder.device.type if recorder.memory.all_device
                         else recorder.memory.is_device(self))
            if on_device and not _is_internal_caller():
                recorder.hazard(HOST_SYNC, f"Tensor.{name}", f"reads {self.device} data on the host")
            return original(self, *args, **kwargs)
        return read

    return wrapped_host_reads(guarded)


def _is_internal_caller() -> bool:
    # torch's own printing calls tolist() on pieces of the tensor it prints; count the print once.
    frame = sys._getframe(2)
    return frame is not None and frame.f_code.co_filename.startswith(os.path.dirname(torch.__file__))


def _callsite() -> str:
    return current_callsite(also_skip=_LINT_FILE)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _reachable(fn: Any, depth: int = 2) -> list[Any]:
    """Objects the callable holds: its `__self__`, closure cells, defaults, and their attributes."""
    roots = [getattr(fn, "__self__", None), *(c.cell_contents for c in (getattr(fn, "__closure__", None) or ())
                                               if _has_contents(c)),
             *(getattr(fn, "__defaults__", None) or ())]
    if isinstance(fn, functools.partial):
        roots += [fn.func, *fn.args, *fn.keywords.values()]
    found: list[Any] = []
    frontier = [r for r in roots if r is not None]
    for _ in range(depth + 1):
        next_frontier = []
        for obj in frontier:
            if any(obj is seen for seen in found) or isinstance(obj, (torch.Tensor, str, int, float)):
                continue
            found.append(obj)
            if isinstance(obj, nn.Module):
                continue
            values = vars(obj).values() if hasattr(obj, "__dict__") else ()
            next_frontier += [v for v in values if v is not None]
            if callable(obj) and hasattr(obj, "__closure__"):
                next_frontier += _reachable(obj, 0)
        frontier = next_frontier
    return found


def _registered_generators(obj: Any) -> tuple[torch.Generator, ...]:
    """The generators an emulated CUDAGraph has registered (a real one does not say)."""
    found = getattr(type(obj), "registered_generators", None)
    return tuple(obj.registered_generators) if isinstance(found, property) else ()


def _reachable_from(obj: Any) -> list[Any]:
    return [v for v in vars(obj).values() if isinstance(v, nn.Module)] if hasattr(obj, "__dict__") else []


def _has_contents(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _tensor_names(owners: list[Any]) -> dict[int, str]:
    from harness.graphs.pointers import snapshot_tensors

    names: dict[int, str] = {}
    for owner in owners:
        if isinstance(owner, (list, tuple, dict)) or not hasattr(owner, "__dict__"):
            continue
        try:
            records = snapshot_tensors(owner, root=type(owner).__name__)
        except (ValueError, RecursionError):
            continue
        for path, record in records.items():
            names.setdefault(record.address, path)
    return names


def _device_of(owners: list[Any]) -> torch.device:
    for owner in owners:
        if isinstance(owner, nn.Module):
            for p in owner.parameters():
                return p.device
    return torch.device("cpu")


def _closure_device(fn: Any) -> torch.device | None:
    """The device of the first accelerator tensor in the callable's closure (a step over bare
    buffers, without a module), or None."""
    for cell in getattr(fn, "__closure__", None) or ():
        value = cell.cell_contents if _has_contents(cell) else None
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            return value.device
    return None
