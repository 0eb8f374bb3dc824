"""The emulator's captured graph: a recording of aten ops replayed, allocation-free, against the
captured storages. The emulated backend (graphs/emulated.py) and the emulated device's
`torch.cuda.CUDAGraph` (harness/emulation/cuda_graph.py) both hand it out, so it lives here, below
both."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable

import torch

from harness import torch_internals
from harness.torch_internals import AutoDispatchBelowADInplaceOrView
from harness.graphs.base import CapturedGraph, FreedMemoryError, released_graph_error
from harness.graphs.emulator.device_asserts import device_assert_error, is_index_out_of_bounds
from harness.graphs.emulator.external import ExternalStorage, freed_error, moved_error
from harness.graphs.emulator.opinfo import ReplayStep
from harness.graphs.emulator.pool import Block, PoolArena
from harness.graphs.emulator.rng import is_state_step
from harness.graphs.emulator.shared_blocks import SharedBlock, first_overwritten
from harness.graphs.emulator.trace import OpRecord
from harness.graphs.emulator.storage_changes import CapturedTensor, first_changed, storage_changed_error


# StorageWeakRef.expired() without its Python method call: one C call per storage at each replay;
# the address check is C calls too (dereference the storage objects, read their data pointers).
_expired = torch_internals.storage_expired
_data_ptr = torch.UntypedStorage.data_ptr


_REPLAYS = threading.local()


def replaying() -> bool:
    """Whether this thread is running a replay's recorded calls. Everything a replay runs is the
    device's work on captured memory, also what runs inside a recorded op's Python kernel (a
    custom op's body, a compiled graph's code), whose tensors are the replay's own aliases of
    that memory: the emulated device launches a Triton kernel met there on the device."""
    return getattr(_REPLAYS, "depth", 0) > 0


@contextlib.contextmanager
def _replay_running(inference_mode: bool):
    """What a replay's recorded calls run under: autograd never sees a graph's work (as on CUDA);
    inference mode is kept as captured, because capture-time outputs are inference tensors exactly
    when it was on; and `replaying()` says so."""
    depth = getattr(_REPLAYS, "depth", 0)
    _REPLAYS.depth = depth + 1
    try:
        with torch.inference_mode(inference_mode), AutoDispatchBelowADInplaceOrView():
            yield
    finally:
        _REPLAYS.depth = depth


class EmulatedGraph(CapturedGraph):
    def __init__(self, output: Any, pool: PoolArena, steps: list[ReplayStep],
                 inference_mode: bool, external: list[ExternalStorage],
                 records: list[OpRecord] | None = None, *,
                 reads: frozenset[int] = frozenset(), writes: frozenset[int] = frozenset(),
                 tensors: tuple[CapturedTensor, ...] = (),
                 allocated: tuple[Block, ...] = (), shared: tuple[SharedBlock, ...] = (),
                 on_overwritten_read: Callable[[FreedMemoryError], None] | None = None,
                 on_freed_read: Callable[[FreedMemoryError], None] | None = None) -> None:
        self.output = output
        self.pool = pool
        self._steps: list[ReplayStep] | None = steps
        self._inference_mode = inference_mode
        self.reads = reads  # the storages a replay reads and writes, for stream tracking
        self.writes = writes
        self._index_external(external)
        pool.token.hold(self)
        self.records: tuple[OpRecord, ...] = tuple(records or ())
        self._tensors = tensors
        # The pool blocks this capture allocated, whose marks its replays renew where another
        # graph reads them or was handed their bytes (shared_blocks.py), and the blocks of other
        # captures into the pool that it reads.
        self._allocated = allocated
        self._contested: tuple[Block, ...] = ()
        self._contest_epoch = -1
        self._shared = shared
        # What a replay reading shared-pool memory another graph overwrote does: raise (None), or
        # hand the error to this and replay, reading the other graph's values as CUDA does (the
        # emulated device's races="report" and "off": shared_blocks.py).
        self._on_overwritten_read = on_overwritten_read
        # What a replay reading memory freed since capture whose bytes the recording kept
        # (external.py: ExternalStorage.kept_at_free) does: raise (None), or hand the error to
        # this and replay on those bytes, as CUDA reads its freed block (races "report", "off").
        self._on_freed_read = on_freed_read
        # Replays issued by `replay_in_steps()` (a stream schedule's launch) that have not started
        # to run: their launch already refused or renewed (`_begin_replay`), and the run that
        # follows (`replay()`, `replay_observed()` or the first step) must not do it again. A
        # second renewal would make this graph's own blocks newer than the ones it reads, and
        # refuse its in-order replay (PyTorch's test_graph_two_successive).
        self._launched = 0

    def _index_external(self, external: list[ExternalStorage]) -> None:
        self._external = external  # holds the weak references the raw pointers below stand for
        # Blocks of other graphs' pools stay valid while their pool is held (pool.PoolUse), so
        # they are checked apart; the rest in bulk, below.
        self._pool_blocks = tuple(s for s in external if s.owner_pool is not None)
        plain = [s for s in external if s.owner_pool is None]
        self._external_weak_refs = tuple(s.liveness.cdata for s in plain)
        self._external_objects = tuple(s.storage_object for s in plain)
        self._external_addresses = tuple(s.address for s in plain)
        self._plain_external = tuple(plain)

    def adopt_reallocated(self, storages: Callable[[], list[torch.UntypedStorage]]) -> int:
        """Where memory the capture used outside its pool was freed and one of `storages` (called
        only then) now starts at its address, holding at least as many bytes, read and write that
        storage from now on, as the CUDA graph does, which keeps the address. For a caller that
        checked the address itself before replaying (cudagraph trees compare a static input's
        data pointer, not its storage); every other replay refuses freed memory. Returns how many
        entries were adopted."""
        if not any(map(_expired, self._external_weak_refs)):
            return 0
        at = {s.data_ptr(): s for s in storages()}
        adopted = 0
        external = list(self._external)
        for index, entry in enumerate(external):
            storage = at.get(entry.address)
            if (entry.owner_pool is None and storage is not None and entry.freed()
                    and storage.nbytes() >= entry.nbytes):
                external[index] = entry.adopted(storage)
                adopted += 1
        if adopted:
            self._index_external(external)
        return adopted

    @property
    def num_ops(self) -> int:
        """How many recorded calls a replay makes (views and `empty` need none)."""
        return len(self._steps or ())

    def replay(self) -> None:
        steps = self._begin_run()
        with _replay_running(self._inference_mode):
            try:
                for fn, args, kwargs in steps:
                    fn(*args, **kwargs)
            except (IndexError, RuntimeError) as error:
                self._raise_as_cuda(error, steps, fn, args)
                raise

    def replay_each(self, run_node: Callable[[Callable[..., Any], tuple, dict], None]) -> None:
        """`replay()` with each recorded node's call made by `run_node(fn, args, kwargs)` (a
        profiler brackets each as one kernel); the graph's RNG state bookkeeping, which is no
        node of CUDA's graph, runs as in `replay()`."""
        steps = self._begin_run()
        with _replay_running(self._inference_mode):
            try:
                for fn, args, kwargs in steps:
                    if is_state_step(fn):
                        fn(*args, **kwargs)
                    else:
                        run_node(fn, args, kwargs)
            except (IndexError, RuntimeError) as error:
                self._raise_as_cuda(error, steps, fn, args)
                raise

    def replay_in_steps(self, caller_dropped: Callable[[torch.UntypedStorage], bool] | None = None
                        ) -> Callable[[], list[Callable[[], None]]]:
        """Launch a replay for a stream schedule: refused here if its memory is gone, then run
        whole (`replay()`) or cut at each recorded call by the function returned, for a schedule
        that interleaves the replay with other streams' work (two graphs replayed concurrently,
        as on a GPU). The cut is made only when asked for: most launches run at once, whole.
        `caller_dropped(storage)`: whether only the schedule's queued work still holds a storage
        (an earlier launch still queued keeps memory alive that the caller freed, which CUDA gave
        back to the allocator at the free): this launch is refused as for freed memory."""
        steps = self._begin_replay(caller_dropped)
        self._launched += 1
        inference = self._inference_mode

        def step(fn, args, kwargs) -> Callable[[], None]:
            def run() -> None:
                # The schedule may run this step long after the launch, after host code freed or
                # regrew memory the step writes through its raw pointers (a graph reset meanwhile
                # still runs what was launched, as CUDA finishes a launch of a destroyed graph).
                self._refuse_lost_memory(released_ok=True, report=False)
                with _replay_running(inference):
                    try:
                        fn(*args, **kwargs)
                    except (IndexError, RuntimeError) as error:
                        self._raise_as_cuda(error, steps, fn, args)
                        raise
            return run

        def started(first: Callable[[], None] | None) -> Callable[[], None]:
            def run() -> None:
                self._launched = max(0, self._launched - 1)
                if first is not None:
                    first()
            return run

        def cut() -> list[Callable[[], None]]:
            runs = [step(*s) for s in steps]
            # Exactly one of the two runs a launch: these steps, or the whole replay (whose
            # `_begin_run` takes the launch back instead).
            return [started(runs[0] if runs else None), *runs[1:]]
        return cut

    def replay_observed(self, before: Callable[[OpRecord], Any],
                        after: Callable[[OpRecord], Any]) -> None:
        """`replay()`, calling `before(record)` ahead of each recorded op's replay call and
        `after(record)` once its outputs hold its results (for harness.check.explain)."""
        steps = self._begin_run()
        by_step: dict[int, list[OpRecord]] = {}
        for record in self.records:
            by_step.setdefault(record.step, []).append(record)
        with _replay_running(self._inference_mode):
            for index, (fn, args, kwargs) in enumerate(steps):
                records = by_step.get(index, ())
                for record in records:
                    before(record)
                try:
                    fn(*args, **kwargs)
                except (IndexError, RuntimeError) as error:
                    self._raise_as_cuda(error, steps, fn, args)
                    raise
                for record in records:
                    after(record)

    def _raise_as_cuda(self, error: BaseException, steps: list[ReplayStep], fn: Any, args: tuple) -> None:
        """Raise CUDA's error for a replayed call that failed where CUDA's kernel fails on the
        device (device_asserts.py); return for any other error, which the caller re-raises."""
        if not is_index_out_of_bounds(error):
            return
        index = next((i for i, (f, a, _) in enumerate(steps) if f is fn and a is args), None)
        records = [r for r in self.records if r.step == index]
        # A step that copies an op's results into the captured outputs carries the op first.
        kernels = (fn, args[0]) if args else (fn,)
        raise device_assert_error(error, kernels, records) from error

    def first_use(self, address: int) -> str:
        """Where the capture first used the external storage that holds `address`, or ""."""
        for storage in self._external:
            start = storage.replay_storage.data_ptr()
            if start <= address < start + storage.replay_storage.nbytes():
                return storage.first_use
        return ""

    def refuse_unreplayable(self, caller_dropped: Callable[[torch.UntypedStorage], bool] | None = None
                            ) -> list[ReplayStep]:
        """The steps to replay, or the error a replay raises (released, freed or moved memory, or
        shared-pool memory another graph overwrote). `caller_dropped`: see `replay_in_steps`."""
        steps = self._refuse_lost_memory()
        if caller_dropped is not None:
            self._refuse_memory_only_queued_work_holds(caller_dropped)
        if self._shared:
            overwritten = first_overwritten(self.pool, self._shared)
            if overwritten is not None:
                if self._on_overwritten_read is None:
                    raise overwritten
                self._on_overwritten_read(overwritten)
        return steps

    def _freed_read(self, first: ExternalStorage, report: bool) -> None:
        """Memory the capture read outside its pool was freed (`first` the first such storage):
        refused, unless every freed one's bytes were kept and the device replays on them
        (`on_freed_read`, told once per replay when `report`)."""
        freed = [s for s in self._plain_external if s.freed()]
        unkept = next((s for s in freed if not s.bytes_kept()), None)
        if unkept is not None or self._on_freed_read is None:
            raise freed_error(unkept or first)
        if report:
            self._on_freed_read(freed_error(first))

    def _refuse_lost_memory(self, *, released_ok: bool = False, report: bool = True
                            ) -> list[ReplayStep] | None:
        """The steps to replay, or the error of a replay whose memory is gone: the graph released,
        memory it reads freed or moved. The replay writes through raw pointers into that memory,
        so this holds at every run, also of a replay launched earlier (a queued replay that runs
        after the host freed its memory would write into the host's heap)."""
        steps = self._steps
        if steps is None and not released_ok:
            raise released_graph_error()
        expired = any(map(_expired, self._external_weak_refs))
        if expired:
            self._freed_read(next(s for s in self._plain_external if s.liveness.expired()),
                             report)
        if self._external_addresses:
            storages = [ref() for ref in self._external_objects]
            if None in storages:
                self._freed_read(next(s for s in self._plain_external
                                      if s.storage_object() is None), report and not expired)
                storages = [s for s in storages if s is not None]  # their bytes were kept
                if tuple(map(_data_ptr, storages)) != tuple(
                        s.address for s in self._plain_external if s.storage_object() is not None):
                    raise moved_error(next(s for s in self._plain_external if s.moved()))
            elif tuple(map(_data_ptr, storages)) != self._external_addresses:
                raise moved_error(next(s for s in self._plain_external if s.moved()))
        for block in self._pool_blocks:
            if block.freed():
                raise freed_error(block)
            if block.moved():
                raise moved_error(block)
        changed = first_changed(self._tensors)
        if changed is not None:
            raise storage_changed_error(changed)
        return steps

    def _refuse_memory_only_queued_work_holds(self, caller_dropped) -> None:
        """At a launch only: a launch earlier than the free ran (or runs) on memory that was
        alive then, as CUDA orders the free after it on the stream."""
        for storage in self._external:
            if storage.owner_pool is not None and not storage.owner_pool.memory_released():
                continue  # another graph's pool keeps the block (pool.PoolUse)
            obj = storage.storage_object()
            if obj is not None and caller_dropped(obj):
                raise freed_error(storage)

    def _begin_run(self) -> list[ReplayStep]:
        """The steps of a replay about to run: refused or renewed here, unless its launch
        (`replay_in_steps()`) did that already. A launch run whole runs at once (a deferred one
        runs its steps, each checking its memory), so nothing can have changed since."""
        if self._launched:
            self._launched -= 1
            steps = self._steps
            if steps is None:
                raise released_graph_error()
            return steps
        return self._begin_replay()

    def _begin_replay(self, caller_dropped=None) -> list[ReplayStep]:
        steps = self.refuse_unreplayable(caller_dropped)
        if self._allocated:
            if self._contest_epoch != self.pool.contest_epoch:
                self._contest_epoch = self.pool.contest_epoch
                self._contested = tuple(b for b in self._allocated if b.contested)
            if self._contested:
                self.pool.renew(self._contested)
        return steps

    def external_storages(self) -> list[torch.UntypedStorage]:
        """The live storages the graph uses but does not own (to keep them alive a while)."""
        return [s for s in (e.storage_object() for e in self._external) if s is not None]

    def reset(self) -> None:
        self._steps = None
        self.pool.token.release(self)
