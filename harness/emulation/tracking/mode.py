"""The dispatch mode that sends every device op to its stream: checked by the tracker, then run
or queued by the schedule. Host ops on pinned memory are the host's accesses; ops that make the
host wait (`.item()`, a blocking copy) run the stream's queue first and join the host's clock.

`memory` says what a tensor is (`is_device`, `is_pinned`, `call_targets_device`,
`makes_host_memory`) and marks results (`tracking_ref`: the weak reference, shared with the
allocator's model, that tells this mode of the storage's death), `stream()` the
current stream's id, `capturing()` whether a graph capture is underway (its ops are recorded, not
issued: the recorder sees them first and nothing here applies).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, Iterator

import torch

from harness import torch_internals
from harness.torch_internals import TorchDispatchMode
from harness.graphs.emulator import opinfo
from harness.graphs.emulator.callsite import callsite_later, current_callsite
from harness.graphs.emulator.opinfo import OpKind
from harness.graphs.emulator.accesses import (blocks_host, copy_blocks_host, higher_order_tensors,
                                              split_accesses, tensors_of)
from harness.emulation.compiled_rng import call_higher_order
from harness.emulation.device_memory import own_storage
from harness.emulation.host_outputs import device_outputs
from harness.emulation.tracking.deferral import defer
from harness.emulation.tracking.names import ShapeLabels, label_of, storage_key
from harness.emulation.tracking.op_plans import OpPlans
from harness.emulation.tracking.queued_holds import QueuedHolds
from harness.emulation.tracking.queued_shapes import ResultShapes, flat_tensors, map_tensors
from harness.emulation.tracking.races import Access, RaceError
from harness.emulation.tracking.schedule import Schedule
from harness.emulation.tracking.tracker import StreamTracker
from harness.emulation.tracking.unseen_writes import IssuedBytes
from harness.graphs.emulator.tensor_subclasses import defer_to_subclass


_HigherOrderOperator = torch_internals.HigherOrderOperator
DEFAULT_STREAM = 0  # device 0's default stream: where memory made before tracking began lives


class _Watch(weakref.ref):
    """The weak reference on a caller's tensor that queued work holds an alias of: its death is
    noted (`StreamWork._caller_dropped`) with the storage it was on. One object per watched
    tensor, not a closure and a ref: most queued ops read a tensor made by the op before."""

    __slots__ = ("tensor_id", "key")


class StreamWork(TorchDispatchMode):
    # Higher-order operators (flex attention's, torch.cond) reach __torch_dispatch__ as one call.
    supports_higher_order_operators = True

    def __init__(self, memory: Any, stream: Callable[[], int], capturing: Callable[[], bool],
                 tracker: StreamTracker, schedule: Schedule) -> None:
        super().__init__()
        self.memory = memory
        self.stream = stream
        self.capturing = capturing
        self.tracker = tracker
        self.schedule = schedule
        # storage key -> the StorageRef noting its free (device_memory.py), shared with the
        # allocator's model: its `on_free` is this mode's `_freed`
        self._allocations: dict[int, Any] = {}
        self._allocated_on: dict[int, int] = {}  # storage key -> the stream that allocated it
        # Strict races found where raising is impossible (a queued op run inside a host wait).
        self._late: list[RaceError] = []
        # Queued work keeps aliases of the memory it uses, not the caller's tensors, so the caller
        # dropping its last tensor is seen when it happens (as the caching allocator sees it).
        self.holds = QueuedHolds()
        self._watched: dict[int, weakref.ref] = {}  # id of a caller's tensor -> weak ref on it
        # Storage keys whose caller tensors died since the last op, with the line that dropped them.
        self._dropped: list[tuple[int, Any]] = []
        self._on_freed = self._freed  # bound once: every result's weak reference calls it
        self._on_dropped = self._caller_dropped  # and every watched caller's tensor's, this
        self._plans = OpPlans()
        self._shape_labels = ShapeLabels()
        self._result_shapes = ResultShapes()
        self.probe = None  # a call_patterns.Probe while a torch call's aten ops are learned

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile refuses to trace under other dispatch modes; this one steps aside while
        # it compiles. A compiled region's own kernels run untracked (the ops it falls back to
        # are still seen); under the adversarial schedule, synchronize before calling one.
        return True

    @contextlib.contextmanager
    def untracked(self) -> Iterator[None]:
        """The device's own bookkeeping runs as captured work does here: at once, judged by
        nobody (no user code can reach its memory to order it: a generator's graph holders)."""
        capturing = self.capturing
        self.capturing = lambda: True
        try:
            yield
        finally:
            self.capturing = capturing

    def _tracked(self, t: torch.Tensor) -> bool:
        return not t.is_meta and (self.memory.is_device(t) or self.memory.is_pinned(t))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if types and defer_to_subclass(types):
            return NotImplemented  # the subclass's own dispatch first (tensor_subclasses.py)
        # The device's placement mode acted on the torch call above this op; what runs here
        # (attribute reads, allocations, the op itself) must not pass through it again.
        with torch_internals.DisableTorchFunction():
            if isinstance(func, _HigherOrderOperator):
                return self._higher_order_op(func, args, kwargs or {})
            return self._dispatch(func, args, kwargs or {})

    def begin_op(self) -> None:
        """What every tracked op does first: judge the frees of tensors dropped since the last,
        and raise a strict race found where raising was impossible."""
        if self._dropped:
            self.check_drops()
        if self._late:
            raise self._late.pop(0)

    def _dispatch(self, func, args, kwargs):
        if self._dropped:
            self.check_drops()
        if self._late:
            raise self._late.pop(0)
        if self.probe is not None:
            self.probe.reached = True
        if self.capturing():
            return func(*args, **kwargs)
        plan = self._plans.get(func)
        if plan.composite:
            # `to`, `reshape`: "may alias" in their schema; what they run underneath is tracked.
            with self:
                # The C++ composite kernel, not torch._decomp's Python one that decompose()
                # prefers (matmul's is a tenth of a step's cost): the same ops reach this mode.
                return torch_internals.call_composite_kernel(func, *args, **kwargs)
        kind = plan.kind
        if kind is OpKind.VIEW:
            return func(*args, **kwargs)  # an alias: no data touched
        tensors = tensors_of((*args, *kwargs.values()) if kwargs else args)
        is_device = self.memory.is_device
        on_device = []  # per tensor, whether it is device memory: asked once per op
        for t in tensors:
            if t.device.type != "cpu":
                if self.probe is not None:
                    self.probe.spoil()
                return func(*args, **kwargs)  # meta and fake tensors: shape work, not device work
            on_device.append(is_device(t))
        targets_device = bool(self.memory.call_targets_device())
        if not targets_device and True not in on_device or (
                targets_device and not tensors and self.memory.makes_host_memory(func)):
            return self._host_op(func, args, kwargs)
        return self._device_op(func, args, kwargs, plan, targets_device, tensors, on_device)

    def _higher_order_op(self, func, args, kwargs) -> Any:
        """A higher-order operator as one kernel on the current stream: it reads every tracked
        tensor it is given and makes its results. What it runs inside goes below this mode (the
        operator's dispatch took the mode off the stack), so a write into an operand is not seen:
        a missed race at worst, never a false one."""
        self.begin_op()
        tensors = higher_order_tensors(args, kwargs)
        if self.capturing() or any(t.device.type != "cpu" for t in tensors):
            # recorded by the capture; or meta and fake tensors
            return call_higher_order(func, args, kwargs)
        if self.probe is not None:
            self.probe.spoil()
        reads = [t for t in tensors if self._tracked(t)]
        if not reads and not self.memory.call_targets_device():
            return call_higher_order(func, args, kwargs)
        stream, name, where = self.stream(), f"{func.name()} (a higher-order op)", callsite_later()
        read_keys = []
        for t in reads:
            read_keys.append(storage_key(t))
            self.note_read(t, read_keys[-1], self._shape_labels.of(t))
        seq = self.tracker.launch(stream, read_keys, (), op=name, where=where)
        if self.schedule.defers(stream):
            self.schedule.run_stream(stream)  # the operator runs now: what its stream queued first
        out = call_higher_order(func, args, kwargs)
        self.schedule.ran(stream, seq)
        self._note_fresh(higher_order_tensors((out,), {}), Access(True, stream, seq, name, where))
        return out

    # --- the host's own work on pinned memory ------------------------------------------------

    def _host_op(self, func, args, kwargs) -> Any:
        reads, writes = split_accesses(func, args, kwargs, self.memory.is_pinned)
        if reads or writes:
            if self.probe is not None:
                self.probe.spoil()
            where = current_callsite()
            name = opinfo.op_name(func)
            for t in reads:
                self._label(t)
                self.tracker.host_read(storage_key(t), op=f"{name} on the host", where=where)
            for t in writes:
                self._label(t)
                self.tracker.host_write(storage_key(t), op=f"{name} on the host", where=where)
        return func(*args, **kwargs)

    # --- device work -------------------------------------------------------------------------

    def _device_op(self, func, args, kwargs, plan, targets_device: bool,
                   tensors: list[torch.Tensor], on_device: list[bool]) -> Any:
        stream = self.stream()
        is_pinned = self.memory.is_pinned
        if plan.written:
            reads, writes = split_accesses(func, args, kwargs, self._tracked)
            device_touched = any(self.memory.is_device(t) for t in (*reads, *writes))
        else:  # no argument written: every tracked tensor is read
            reads = [t for t, device in zip(tensors, on_device) if device or is_pinned(t)]
            writes = []
            device_touched = True in on_device
        name, where = plan.name, callsite_later()
        labels, allocations = self.tracker.labels, self._allocations
        read_keys, write_keys = [], []
        for accessed, keys in ((reads, read_keys), (writes, write_keys)):
            for t in accessed:
                key = t.untyped_storage().data_ptr()
                keys.append(key)
                if key not in labels:
                    labels[key] = self._shape_labels.of(t)
                if key not in allocations and self.memory.is_device(t):
                    self._note_earlier(t, key)
        reported = len(self.tracker.reports)
        seq = self.tracker.launch(stream, read_keys, write_keys, op=name, where=where)
        if plan.is_copy:
            # A copy to or from pinned memory records an event on the pinned block
            # (CachingHostAllocator_recordEvent), so the host allocator reuses it only once the
            # copy is done: a free right after issuing the copy is safe, as after record_stream.
            for t, key in zip((*reads, *writes), (*read_keys, *write_keys)):
                if is_pinned(t):
                    self.tracker.record_stream(key, stream)
        overtakes = self.schedule.adversarial and self.overtakes_queued_work(reported)
        memory = self.memory
        probe, ran_in_order, queued = self.probe, False, False
        if plan.may_block_host and (
                copy_blocks_host(func, args, kwargs, memory.is_device, is_pinned, targets_device)
                if plan.is_copy else
                blocks_host(func, args, kwargs, memory.is_device, is_pinned, targets_device)):
            self.schedule.run_stream(stream)
            out = func(*args, **kwargs)
            self.schedule.ran(stream, seq)
            self.tracker.synchronize_stream(stream)
        elif (plan.deferrable and device_touched and not overtakes
              and self.schedule.defers(stream)):
            held, release = self.aliases_for_queue((args, kwargs))
            out, run = defer(func, args, kwargs, plan.kind, held, self._result_shapes.of)
            if plan.kind is not OpKind.MUTATING:
                release = self.holding_results(out, release)
            issued = self._pinned_inputs_as_issued(reads)
            access = Access(False, stream, seq, name, where)

            def run_and_release() -> None:
                if issued:
                    self._check_unseen_host_writes(issued, access)
                run()
                release()

            self.schedule.queue(stream, seq, run_and_release)
            queued = True
        else:
            ran_in_order = not self.schedule.defers(stream)
            if not ran_in_order:
                self.schedule.run_stream(stream)  # what cannot wait in the queue runs in order
            out = func(*args, **kwargs)
            self.schedule.ran(stream, seq)
        to_host = plan.is_to_copy and kwargs.get("device") is not None and not targets_device
        fresh = plan.kind is not OpKind.MUTATING and not to_host
        if fresh:
            self._note_fresh(out if plan.host is None else device_outputs(out, plan.host),
                             Access(True, stream, seq, name, where), plan.touches_results)
        if probe is not None:
            # Learnable, whether it ran in issue order or waited in the stream's queue: a fresh
            # result with nothing written, or an in-place op (its result the tensor it wrote)
            # that neither draws a seed nor changes metadata (`deferrable`).
            in_place = (plan.kind is OpKind.MUTATING and plan.deferrable and bool(write_keys)
                        and not fresh)
            # An op with host outputs is never learned: a pattern notes its result device memory.
            probe.device_op(plan, reads, read_keys, writes, write_keys,
                            (ran_in_order or queued) and plan.host is None
                            and (in_place or (fresh and not write_keys)), out, queued,
                            (args, kwargs))
        return out

    def overtakes_queued_work(self, reported: int) -> bool:
        """Whether the op just launched is a write that races with an access another stream still
        has queued (reported since `reported`): then the adversarial schedule runs it at once,
        ahead of that access, the order in which the race gives wrong values (a writer ahead of
        an earlier reader). Nothing orders the two, so a GPU may run them so too."""
        if not self.schedule.adversarial:
            return False
        return any(r.current.write and r.previous.participant != r.current.participant
                   and self.schedule.queued(r.previous.participant, r.previous.seq)
                   for r in self.tracker.reports[reported:])

    def _pinned_inputs_as_issued(self, reads: list[torch.Tensor]) -> IssuedBytes:
        """The pinned buffers a queued op reads, as they are now; not those a device op still
        queued will write first (their bytes change by right)."""
        tracker = self.tracker
        return IssuedBytes([(t, tracker.writes_so_far(storage_key(t))) for t in reads
                            if self.memory.is_pinned(t)
                            and not tracker.pending_device_write(storage_key(t), self.schedule.queued)])

    def _check_unseen_host_writes(self, issued: IssuedBytes, access: Access) -> None:
        for t, writes_at_issue in issued.changed():
            try:
                self.tracker.unseen_host_write(storage_key(t), access, writes_at_issue)
            except RaceError as race:
                self._late.append(race)  # raised at the next op: the host is inside a wait

    def aliases_for_queue(self, tree: Any) -> tuple[Any, Callable[[], None]]:
        """`tree` with each tracked tensor replaced by an alias for the queued call, the caller's
        tensor watched for its death; and the call that forgets the aliases once the work ran."""
        keys: list[int] = []
        alias = self._alias
        return map_tensors(lambda t: alias(t, keys), tree), self._release(keys)

    def aliases_of_positional(self, args: tuple, storages: list,
                              on_device: tuple[bool, ...]) -> tuple[tuple, Callable[[], None]]:
        """`aliases_for_queue` of a learned call (call_patterns.py) whose tensors are all
        positional arguments (none in a list, none by keyword), given their `storages` in order
        and which are device memory: the arguments, one pass. Such a call has no pinned or meta
        tensor, so what it tracks is its device memory."""
        keys: list[int] = []
        held = []
        taken = 0
        alias, watched, on_dropped = self.holds.alias, self._watched, self._on_dropped
        for a in args:
            if isinstance(a, torch.Tensor):
                taken += 1
                if on_device[taken - 1]:  # _alias_of_tracked, inlined
                    key = storages[taken - 1].data_ptr()
                    keys.append(key)
                    alias(key)
                    if id(a) not in watched:
                        watch = watched[id(a)] = _Watch(a, on_dropped)
                        watch.tensor_id, watch.key = id(a), key
                    a = a.detach()
            held.append(a)
        return tuple(held), self._release(keys)

    def _alias(self, t: torch.Tensor, keys: list[int]) -> torch.Tensor:
        return self._alias_of_tracked(t, keys) if self._tracked(t) else t

    def _alias_of_tracked(self, t: torch.Tensor, keys: list[int]) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        keys.append(key)
        self.holds.alias(key)
        if id(t) not in self._watched:
            watch = self._watched[id(t)] = _Watch(t, self._on_dropped)
            watch.tensor_id, watch.key = id(t), key
        return t.detach()

    def holding_results(self, out: Any, release: Callable[[], None]) -> Callable[[], None]:
        """A queued op keeps its fresh results' memory to write it when it runs: that use is the
        queue's, not the caller's, so a caller's drop judged meanwhile (`check_drops`) counts it
        among the queued aliases. `release` extended to forget them once the op ran."""
        if type(out) is torch.Tensor:  # the hot path: a learned call's one result
            if not out.numel():
                return release
            key = [out.untyped_storage().data_ptr()]
            holds = self.holds
            holds.alias(key[0])

            def release_with_result() -> None:
                release()
                holds.release_aliases(key)
                key.clear()  # as `_release`: a second call forgets nothing

            return release_with_result
        keys = [t.untyped_storage().data_ptr() for t in flat_tensors(out) if t.numel()]
        if not keys:
            return release
        for key in keys:
            self.holds.alias(key)
        forget_results = self._release(keys)

        def release_all() -> None:
            release()
            forget_results()

        return release_all

    def _release(self, keys: list[int]) -> Callable[[], None]:
        def release() -> None:
            self.holds.release_aliases(keys)
            keys.clear()

        return release

    def _caller_dropped(self, watch: _Watch) -> None:
        if self._watched.get(watch.tensor_id) is watch:
            del self._watched[watch.tensor_id]
        # Judged at the next op only while queued work still holds the memory; otherwise the
        # storage's own death is the free (`_freed`), and a bare storage the program keeps
        # keeps the allocation, as on CUDA. Nor where only its allocating stream touched it
        # since its last write (most drops: a step's intermediates on one stream): that judgement
        # finds nothing pending, and the death finds the same, as no op can touch the memory
        # meanwhile (the caller has no tensor on it, and queued work launched at issue).
        key = watch.key
        stream = self._allocated_on.get(key)
        if stream is not None and self.holds.holds(key) and \
                not self.tracker.touched_only_by(key, stream):
            self._dropped.append((key, callsite_later()))

    def check_drops(self) -> None:
        """For storages whose caller tensors died: if only queued work still holds the memory,
        the caller freed it while that work is pending (what the caching allocator would reuse)."""
        dropped, self._dropped = self._dropped, []
        for key, where in dict(dropped).items():
            ref = self._allocations.get(key)
            storage = ref() if ref is not None else None
            if storage is None or key not in self._allocated_on:
                continue
            # The storage's own Python object holds one use; queued aliases hold the rest.
            uses = torch_internals.storage_use_count(torch_internals.storage_key(storage))
            if uses - 1 > self.holds.aliases(key):
                continue  # the caller still has a tensor on it
            self.tracker.free(key, self._allocated_on.pop(key), nbytes=ref.size, where=where)

    def _note_fresh(self, out: Any, write: Access, touched: bool = True) -> None:
        """Results of a device op (`write`) are device memory, written by it (`touched`; False: only
        allocated, `torch.empty`), freed when dropped."""
        stream = write.participant
        tracker, labels = self.tracker, self.tracker.labels
        allocations, allocated_on = self._allocations, self._allocated_on
        for t in tensors_of((out,) if isinstance(out, torch.Tensor) else
                            out if isinstance(out, (list, tuple)) else ()):
            if t.device.type != "cpu":
                continue
            storage = own_storage(t)
            if storage is None or storage.nbytes() == 0:
                continue
            key = storage.data_ptr()
            ref = allocations.get(key)
            if ref is None or ref() is not storage:  # made now: device memory from here
                self._track(self.memory.tracking_ref(storage), key, stream, new=True)
            elif allocated_on.get(key) != stream:
                self._track(ref, key, stream, new=False)
            labels[key] = self._shape_labels.of(t)  # before the write: a reuse report names it
            tracker.record_fresh(key, write, touched=touched)

    def note_read(self, t: torch.Tensor, key: int, label) -> None:
        """`_device_op`'s bookkeeping of one tensor it reads or writes, before the launch, for a
        caller that did not dispatch."""
        if key not in self.tracker.labels:
            self.tracker.labels[key] = label
        if key not in self._allocations and self.memory.is_device(t):
            self._note_earlier(t, key)

    def note_accesses(self, tensors: list, storages: list, positions: tuple,
                      labels: tuple) -> list[int]:
        """`note_read` of the tensors at `positions` of a learned call (`tensors`, with their
        `storages`), under `labels`: their storage keys, in that order. One call for them all."""
        keys = []
        known, allocations = self.tracker.labels, self._allocations
        for position, label in zip(positions, labels):
            key = storages[position].data_ptr()
            keys.append(key)
            if key not in known:
                known[key] = label
            if key not in allocations and self.memory.is_device(tensors[position]):
                self._note_earlier(tensors[position], key)
        return keys

    def note_result(self, t: torch.Tensor, label, write: Access, *, touched: bool = True) -> None:
        """`_note_fresh` of one result with its label known, for a caller that did not dispatch."""
        try:
            storage = t.untyped_storage()  # own_storage, inlined: every learned call's result
        except (RuntimeError, NotImplementedError):
            return
        nbytes = storage.nbytes()
        if nbytes == 0:
            return
        key = storage.data_ptr()
        stream = write.participant
        ref = self._allocations.get(key)
        if ref is None or ref() is not storage:  # made now: device memory from here
            # _track inlined: every learned call's result
            ref = self.memory.tracking_ref(storage)
            ref.on_free, ref.key, ref.stream, ref.size = self._on_freed, key, stream, nbytes
            self._allocations[key] = ref
            self._allocated_on[key] = stream
            self.tracker.labels[key] = label
            self.tracker.record_allocated(key, nbytes, write, touched=touched)
            return
        if self._allocated_on.get(key) != stream:
            self._track(ref, key, stream, new=False)
        self.tracker.labels[key] = label
        self.tracker.record_fresh(key, write, touched=touched)

    def label_of(self, t: torch.Tensor):
        return self._shape_labels.of(t)

    def adopted(self, storage: torch.UntypedStorage, ref: Any) -> None:
        """Device memory made now, outside a capture, with its StorageRef (None: it has no
        allocation of its own): it belongs to the current stream."""
        key = storage.data_ptr()
        known = self._allocations.get(key)
        if known is not None and known() is storage:
            return  # noted by the op that made it (_note_fresh), on that op's stream
        if not self.capturing() and storage.nbytes():
            self._track(self.memory.tracking_ref(storage) if ref is None else ref, key,
                        self.stream())

    def _note_earlier(self, t: torch.Tensor, key: int) -> None:
        """Device memory made before tracking began: it lives on the default stream."""
        self._track(self.memory.tracking_ref(t.untyped_storage()), key, DEFAULT_STREAM, new=False)

    def _track(self, ref: Any, key: int, stream: int, *, new: bool = True) -> None:
        """The storage of `ref` (a StorageRef) belongs to `stream` from now, its death noted by
        `_freed`; `new`: allocated now (not memory made before tracking began), so it may be a
        block freed on that stream (tracker.allocate)."""
        storage = ref()
        nbytes = storage.nbytes()
        ref.on_free, ref.key, ref.stream, ref.size = self._on_freed, key, stream, nbytes
        self._allocations[key] = ref
        self._allocated_on[key] = stream
        if new:
            self.tracker.allocate(key, stream, nbytes)

    def _freed(self, ref: Any) -> None:
        key = ref.key
        if self._allocations.get(key) is ref:
            del self._allocations[key]
        if self._allocated_on.pop(key, None) is None:
            return  # already judged when its caller dropped it (check_drops)
        self.tracker.free(key, ref.stream, nbytes=ref.size, where=callsite_later)

    def _label(self, t: torch.Tensor) -> None:
        key = storage_key(t)
        if key not in self.tracker.labels:
            self.tracker.labels[key] = label_of(t)

    def raise_later(self, race: RaceError) -> None:
        """Raise `race` at the next tracked op, on whichever thread issues it (a race met on a
        thread the caller's test does not join the exceptions of)."""
        self._late.append(race)

    def raise_late(self) -> None:
        """Raise a strict race found where raising was impossible, if any (at the end of the
        tracked region)."""
        if self._late:
            raise self._late.pop(0)

    def take_late(self) -> list[RaceError]:
        """The strict races found where raising was impossible since the last call (frees of
        tensors dropped since the last op are noted first); they are not raised later."""
        self.check_drops()
        late, self._late = self._late, []
        return late
