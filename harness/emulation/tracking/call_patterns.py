"""Torch calls whose stream tracking is known without dispatching them.

Most torch calls of a decode step are one functional aten op (`mul`, `mm` under `linear`,
`_to_copy`, `silu`) or only views, the same few dozen over and over. The stream mode (a
TorchDispatchMode) costs a Python call per aten op whatever it does, which is most of tracked
eager's cost. So the first time the placement mode hands over a torch call of a given signature,
the call runs under the stream mode with a `Probe` watching what the mode does for it; where that
is nothing (views), or exactly one device op that ran in issue order and either made a fresh
result writing nothing else, or wrote in place tensors the call was given (`index_put_`, `add_`:
no seed drawn, no metadata changed), the signature's `CallPattern` keeps it: the op's name, which
of the call's tensors it read and wrote and under which labels, and its fresh result's label.
Later calls of that signature run with dispatch modes off and make the same tracker calls
(`launch`, `record_fresh`, labels, allocation notes) with the same arguments and sequence numbers;
races, reports and their lines come out as the stream mode gives them.

A signature is everything the aten ops a call reaches depend on: the function; per tensor its
dtype, shape, strides, whether it is an inference tensor or needs grad, and whether it is device
memory; every other argument by type and value; and the dispatch state that selects kernels and
decompositions (grad and inference mode, deterministic algorithms, autocast, the default dtype).
A call whose arguments include anything else (a tensor subclass, pinned memory, a generator, an
object), and a callable that is not torch's own (a user's `autograd.Function.apply`, whose Python
may read any state), is never learned and always dispatches. Nothing is learned or used while a
capture runs, or with any other dispatch mode on the stack (a user's mode, the explainer's op log
must see every aten op).

On a stream that queues its work (the adversarial schedule, a stream behind `_sleep`) the op waits
in the queue, and a call whose op waited when it was learned is queued whole the same way
(`_queue`): the same launch, aliases held for the queue, its fresh result allocated now and
poisoned until the queue runs the call (deferral.QueuedCall) below autograd in the state of its
issue. A pattern learned in one of the two states is used only in that state; calls autograd
records, under autocast or deterministic algorithms, or whose result is a view or not one dense
block, dispatch.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from harness import torch_internals
from harness.graphs.emulator.callsite import callsite_later
from harness.graphs.emulator.pool import poison_value
from harness.emulation.device_memory import DEVICE, PINNED, memory_mark
from harness.emulation.tracking.deferral import defer_call, full_strides, out_form
from harness.emulation.tracking.races import new_access

_Tensor = torch.Tensor
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_SCALARS = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device,
                      torch.memory_format, torch.layout, type(Ellipsis)})
_DisableTorchDispatch = torch_internals.DisableTorchDispatch
_DisableTorchFunction = torch_internals.DisableTorchFunction
_increment_version = torch.autograd.graph.increment_version
_stack_length = torch_internals.len_torch_dispatch_stack
_stack_at = torch_internals.get_dispatch_stack_at
_grad_on = torch.is_grad_enabled
_inference_on = torch.is_inference_mode_enabled
_deterministic = torch_internals.deterministic_algorithms
_autocast_on = torch.is_autocast_enabled
_any_autocast_on = torch_internals.is_any_autocast_enabled
_default_dtype = torch.get_default_dtype


_NO_AUTOCAST = (False, False)  # autocast on neither the cpu nor cuda, in a signature


class _Unkeyed(Exception):
    """An argument the signature cannot name: the call always dispatches."""


@dataclass(frozen=True)
class CallPattern:
    """What the stream mode did for one signature: nothing (`name` empty), or one device op."""

    name: str = ""
    read_positions: tuple[int, ...] = ()  # per tensor the op read, its index among the call's
    read_labels: tuple = ()
    result_label: Any = None  # None for an op in place: its result is the tensor it wrote
    touches_result: bool = True  # False for `empty` and kin (op_plans.py)
    write_positions: tuple[int, ...] = ()  # per tensor the op wrote in place, as read_positions
    write_labels: tuple = ()
    # Learned with the op waiting in its stream's queue (the adversarial schedule, a stream behind
    # `_sleep`): used only while the stream queues, and a pattern learned in order only while not.
    queued: bool = False
    # queued, fresh: the call's result's shape, stride, dtype and poison (None: it is empty), and
    # whether its strides are those `torch.full` gives the shape (deferral.defer_call)
    result_meta: tuple | None = None
    returns: int | None = None  # queued, in place: which of the call's tensors it returns (None)
    bumps: tuple[int, ...] = ()  # queued, in place: the written tensors with a version counter
    positional: bool = False  # queued: every tensor of the call is a positional argument
    # queued, positional: per tensor, whether it is device memory (the signature keeps it)
    on_device: tuple[bool, ...] = ()
    # queued, fresh: the aten op's `out=` form, where the op was given the call's positional
    # arguments themselves (deferral.out_form); None: the call runs again and is copied
    out_op: Any = None


_NOTHING = CallPattern()  # only views reached the stream mode
_UNSEEN = object()  # no aten op reached it (`x.size()`): nothing to do, not even the op's checks
_NEVER = object()  # a signature that dispatches every time (the probe saw more than one op)


class Probe:
    """What the stream mode did during one torch call on one thread.

    It holds no tensor: a reference kept while the call runs is one CUDA does not have, and
    code inside one torch call reads use counts (autograd's AccumulateGrad steals a gradient
    only when nothing else holds it, so `backward()`, learned here, cloned it). The first op is
    kept as its read and write labels and keys, and its fresh result's label and a weak
    reference to the result's storage (which a view returned by the call keeps alive where the
    result's own tensor dies: `linear`'s `mm` under its `_unsafe_view`)."""

    __slots__ = ("thread", "spoiled", "reached", "ops", "_label", "_arg_ids")

    def __init__(self, label, args: tuple = (), kwargs: dict | None = None) -> None:
        self.thread = threading.get_ident()
        self.spoiled = False
        self.reached = False  # whether any aten op reached the stream mode
        self.ops: list[tuple] = []
        self._label = label  # the stream mode's label_of: a tensor's shape and dtype, immutable
        # The ids of the call's positional arguments (alive while it runs; no reference kept),
        # to tell an op given exactly those (`x * y` reaching `mul.Tensor(x, y)`); None: kwargs
        self._arg_ids = None if kwargs else tuple(map(id, args))

    def spoil(self) -> None:
        self.spoiled = True

    def device_op(self, plan, reads: list, read_keys: list, writes: list, write_keys: list,
                  simple: bool, out: Any, queued: bool = False, call: tuple = ((), None)) -> None:
        """`simple`: the op ran in issue order or waited in its stream's queue (`queued`), and
        made a fresh result writing nothing else or wrote in place what `writes` holds (mode.py
        says which ops may be learned). `call`: the op's (args, kwargs)."""
        if threading.get_ident() != self.thread or not simple:
            self.spoiled = True
        if self.spoiled or self.ops:
            self.ops.append(None)  # the call is never learned (_pattern): nothing to keep
            return
        label = self._label
        result = None
        if write_keys:
            self.ops.append((plan, tuple(label(t) for t in reads), read_keys,
                             tuple(label(t) for t in writes), write_keys, None, queued, False))
            return
        if isinstance(out, _Tensor):
            try:
                result = (weakref.ref(out.untyped_storage()), label(out))
            except (RuntimeError, NotImplementedError, TypeError):
                result = None  # no storage to name (never learned, as before)
        args, kwargs = call
        given = (queued and not kwargs and self._arg_ids is not None
                 and tuple(map(id, args)) == self._arg_ids)
        self.ops.append((plan, tuple(label(t) for t in reads), read_keys, (), [], result, queued,
                         given))


def _tensor_meta(a: Any, tensors: list, storages: list) -> tuple:
    if type(a) not in _PLAIN:
        raise _Unkeyed
    try:
        storage = a.untyped_storage()
    except (RuntimeError, NotImplementedError):
        # Sparse and mkldnn layouts; a torch.func wrapper (vmap's batched tensor, grad's), whose
        # reads the aten ops below the transform see on the tensors it wraps, tracked there.
        raise _Unkeyed from None
    mark = memory_mark(storage)
    dtype = a.dtype
    # Device memory is host memory of the CPU's: asked only of other tensors (meta ones).
    if mark is not DEVICE and (mark == PINNED or not a.is_cpu) or dtype.is_complex:
        raise _Unkeyed
    tensors.append(a)
    storages.append(storage)
    return (dtype, a.shape, a.stride(), a.is_inference(), a.requires_grad, mark is DEVICE)


def _meta(a: Any, tensors: list, storages: list) -> Any:
    if isinstance(a, _Tensor):
        return _tensor_meta(a, tensors, storages)
    kind = type(a)
    if kind in _SCALARS:
        return (kind, a)
    if kind is list or kind is tuple or kind is torch.Size:
        return (kind, *[_meta(b, tensors, storages) for b in a])
    if kind is slice:  # unhashable before Python 3.12
        return (slice, _meta(a.start, tensors, storages), _meta(a.stop, tensors, storages),
                _meta(a.step, tensors, storages))
    raise _Unkeyed


def signature(func: Any, args: tuple, kwargs: dict,
              scanned: list | None = None) -> tuple[tuple, list, list] | None:
    """(the call's signature, its tensors in argument order, their storages), or None for a call
    never learned. The signature may be unhashable (an unhashable scalar inside it): the lookup
    says. `scanned`: the memory marks of the tensors among `args` (not inside a list), in order,
    as the caller read them (the placement mode's scan), which are not read again."""
    tensors: list = []
    storages: list = []
    taken = 0  # the marks of `scanned` used so far
    # The hot path: one signature per device call, so tensors and scalars are inlined.
    autocast = (_autocast_on("cpu"), _autocast_on("cuda")) if _any_autocast_on() else _NO_AUTOCAST
    parts = [func, _grad_on(), _inference_on(), _deterministic(), autocast, _default_dtype()]
    append = parts.append
    try:
        for a in args:
            kind = type(a)
            if kind is _Tensor:  # _tensor_meta inlined
                try:
                    storage = a.untyped_storage()
                except (RuntimeError, NotImplementedError):
                    return None
                if scanned is None:
                    mark = memory_mark(storage)
                else:
                    mark = scanned[taken]
                    taken += 1
                dtype = a.dtype
                if mark is not DEVICE and (mark == PINNED or not a.is_cpu) or dtype.is_complex:
                    return None
                tensors.append(a)
                storages.append(storage)
                append((dtype, a.shape, a.stride(), a.is_inference(), a.requires_grad,
                        mark is DEVICE))
            elif kind in _SCALARS:
                append(kind)
                append(a)
            else:
                if scanned is not None and isinstance(a, _Tensor):
                    taken += 1  # a Parameter: its mark is read again below
                append(_meta(a, tensors, storages))
        if kwargs:
            append(tuple((k, _meta(v, tensors, storages)) for k, v in kwargs.items()))
    except _Unkeyed:
        return None
    return tuple(parts), tensors, storages


def _torch_owned(func: Any) -> bool:
    """Whether `func` is torch's own (an op, a Tensor method, torch.nn.functional), whose aten ops
    follow from the signature; a user's callable (`autograd.Function.apply`) may read anything."""
    bound = getattr(func, "__self__", None)
    if isinstance(bound, type) and not bound.__module__.startswith("torch"):
        return False
    module = getattr(func, "__module__", None) or getattr(
        getattr(func, "__objclass__", None), "__module__", None) or ""
    return module == "torch" or module.startswith("torch.")


class CallPatterns:
    """The patterns learned by one stream mode, and the torch calls run through them."""

    BOUND = 8192  # signatures kept; past it the table starts again

    def __init__(self, mode: Any, work: Any) -> None:
        self.mode = mode
        self._work = work  # its `active`: whether the stream mode is on the dispatch stack
        self._patterns: dict[tuple, Any] = {}
        self.used = 0  # calls run through a pattern, for statistics and tests

    def _usable(self) -> bool:
        mode = self.mode
        return (self._work.active and mode.probe is None and not mode.capturing()
                and _stack_length() == 1 and _stack_at(0) is mode)

    def run(self, func: Any, args: tuple, kwargs: dict, scanned: list | None = None) -> Any:
        """`func(*args, **kwargs)` of a device call, tracked as the stream mode tracks it.
        `scanned`: the memory marks of the call's positional tensors, as the placement mode read
        them (`signature`)."""
        mode = self.mode
        # The hot path (every device call): `_usable` inlined.
        if not (self._work.active and mode.probe is None and not mode.capturing()
                and _stack_length() == 1 and _stack_at(0) is mode):
            return func(*args, **kwargs)
        found = signature(func, args, kwargs, scanned)
        if found is None:
            return func(*args, **kwargs)
        key, tensors, storages = found
        try:
            pattern = self._patterns.get(key)
        except TypeError:  # an unhashable argument: never learned
            return func(*args, **kwargs)
        if pattern is _NEVER or pattern is _UNSEEN:
            return func(*args, **kwargs)
        if pattern is None:
            if not _torch_owned(func):
                self._remember(key, _NEVER)
                return func(*args, **kwargs)
            return self._learn(key, tensors, func, args, kwargs)
        if pattern is _NOTHING:  # views: no stream to ask
            mode.begin_op()
            with _DisableTorchDispatch():
                return func(*args, **kwargs)
        stream = mode.stream()
        schedule = mode.schedule
        if schedule.defers(stream) is not pattern.queued:
            return func(*args, **kwargs)  # learned in issue order, now queued, or the reverse
        mode.begin_op()
        name, where = pattern.name, callsite_later()
        read_keys = mode.note_accesses(tensors, storages, pattern.read_positions,
                                       pattern.read_labels)
        write_keys = mode.note_accesses(tensors, storages, pattern.write_positions,
                                        pattern.write_labels) if pattern.write_positions else []
        self.used += 1
        if pattern.queued:
            return self._queue(pattern, tensors, storages, func, args, kwargs, stream, read_keys,
                               write_keys, where)
        seq = mode.tracker.launch(stream, read_keys, write_keys, op=name, where=where)
        with _DisableTorchDispatch():
            out = func(*args, **kwargs)
        schedule.ran(stream, seq)
        if not write_keys:
            mode.note_result(out, pattern.result_label,
                             new_access((True, stream, seq, name, where)),
                             touched=pattern.touches_result)
        return out

    def _queue(self, pattern: CallPattern, tensors: list, storages: list, func: Any, args: tuple,
               kwargs: dict, stream: int, read_keys: list, write_keys: list, where: Any) -> Any:
        """A learned call on a stream that queues its work, as the stream mode queues the op
        it reaches (mode.py, `_device_op`): launched now, its tensors held as aliases, its fresh
        result poisoned until the queue runs it; or run at once, after its stream's queue, when
        it is a write that overtakes an access another stream has queued."""
        mode = self.mode
        tracker, schedule, name = mode.tracker, mode.schedule, pattern.name
        for position in pattern.bumps:
            _increment_version(tensors[position])  # as autograd's in-place kernel did at issue
        reported = len(tracker.reports)
        seq = tracker.launch(stream, read_keys, write_keys, op=name, where=where)
        returns = None if pattern.returns is None else tensors[pattern.returns]
        if len(tracker.reports) > reported and mode.overtakes_queued_work(reported):
            with _DisableTorchDispatch(), _DisableTorchFunction():
                out, call = defer_call(func, (args, kwargs), pattern.result_meta, returns)
                schedule.run_stream(stream)
                call()
            schedule.ran(stream, seq)
        else:
            # One guard for the aliases (views, no op of the caller's) and the poisoned result.
            with _DisableTorchDispatch(), _DisableTorchFunction():
                if pattern.positional:
                    held_args, release = mode.aliases_of_positional(args, storages,
                                                                    pattern.on_device)
                    held = (held_args, dict(kwargs) if kwargs else kwargs)
                else:
                    held, release = mode.aliases_for_queue((args, kwargs))
                out, call = defer_call(func, held, pattern.result_meta, returns, pattern.out_op)
            call.release = release if returns is not None else mode.holding_results(out, release)
            schedule.queue(stream, seq, call)
        if not write_keys:
            mode.note_result(out, pattern.result_label,
                             new_access((True, stream, seq, name, where)),
                             touched=pattern.touches_result)
        return out

    def _learn(self, key: tuple, tensors: list, func: Any, args: tuple, kwargs: dict) -> Any:
        mode = self.mode
        # as the signature saw them (its key keeps them): whether each tensor is device memory
        on_device = tuple(memory_mark(t) is DEVICE for t in tensors)
        probe = mode.probe = Probe(mode.label_of, args, kwargs)
        try:
            out = func(*args, **kwargs)
        finally:
            mode.probe = None
        self._remember(key, self._pattern(probe, tensors, on_device, args, out))
        return out

    def _remember(self, key: tuple, pattern: Any) -> None:
        if len(self._patterns) >= self.BOUND:
            self._patterns.clear()
        self._patterns[key] = pattern

    def _pattern(self, probe: Probe, tensors: list, on_device: tuple[bool, ...], args: tuple,
                 out: Any) -> Any:
        if probe.spoiled or len(probe.ops) > 1:
            return _NEVER
        if not probe.ops:
            return _NOTHING if probe.reached else _UNSEEN
        plan, read_labels, read_keys, write_labels, write_keys, result, queued, given = probe.ops[0]
        if not write_keys:
            # A storage freed by the call's end is not what it returned, whatever its address.
            storage = None if result is None else result[0]()
            if storage is None or not isinstance(out, _Tensor) \
                    or out.untyped_storage().data_ptr() != storage.data_ptr():
                return _NEVER
        storages = [t.untyped_storage().data_ptr() for t in tensors]
        if len(set(storages)) != len(storages):
            return _NEVER  # which argument an aliased access came from is ambiguous
        if any(key not in storages for key in (*read_keys, *write_keys)):
            return _NEVER  # touched memory the call was not given
        write_positions = tuple(storages.index(key) for key in write_keys)
        how = {}
        if queued:
            how = _queued_fields(tensors, out, write_positions)
            if how is None:
                return _NEVER
            how["positional"] = len(tensors) == sum(isinstance(a, _Tensor) for a in args)
            if how["positional"]:
                how["on_device"] = on_device
            if given and how.get("result_meta") is not None and how["positional"]:
                how["out_op"] = out_form(plan.func)
        return CallPattern(plan.name, tuple(storages.index(key) for key in read_keys),
                           read_labels, None if result is None else result[1],
                           plan.touches_results, write_positions, write_labels, **how)


def _queued_fields(tensors: list, out: Any, write_positions: tuple) -> dict | None:
    """What a call whose op waited in the queue needs to be queued whole (deferral.QueuedCall),
    or None where queuing the torch call would not be queuing its op: autograd records the call
    at issue, autocast or deterministic algorithms would apply again when it runs, or the result
    is not one fresh dense block (a view, an offset, strides with gaps) that a poisoned
    `empty_strided` of its shape stands for."""
    if _autocast_on("cpu") or _autocast_on("cuda") or _deterministic():
        return None
    if _grad_on() and any(t.requires_grad for t in tensors):
        return None
    if write_positions:
        returns = None
        if out is not None:
            returns = next((i for i, t in enumerate(tensors) if out is t), None)
            if returns is None:
                return None
        return dict(queued=True, returns=returns,
                    bumps=tuple(p for p in write_positions if not tensors[p].is_inference()))
    if type(out) is not _Tensor or out.requires_grad or out._is_view() or out.storage_offset() \
            or not out.is_contiguous() \
            or out.untyped_storage().nbytes() != out.numel() * out.element_size():
        return None
    return dict(queued=True, result_meta=(out.shape, out.stride(), out.dtype,
                                          poison_value(out.dtype) if out.numel() else None,
                                          out.stride() == full_strides(out.shape)))
