"""The emulated CUDA device's memory: CPU tensors, each device or host memory by its storage.

A storage is marked when the device makes it (an op with device inputs, a factory naming cuda, a
copy to the device, a capture's pool block); everything else is host memory, pinned when marked so
(`pin_memory()`, `pin_memory=True`). The mark is an attribute of the storage's Python object, which
PyTorch keeps with its StorageImpl, so views, `.data`, `module.to("cuda")` (which rebinds
`param.data`) and `set_` share it without any bookkeeping. Each marked storage is an allocation of
CUDA's caching allocator, as its accounting has it (caching_allocator.py), made on the stream
current then and freed when a weak reference to the storage says it died (a storage's Python object
dies with its StorageImpl): what `torch.cuda.memory_stats()` and friends answer from.

The allocations and frees are logged as they happen and played into the accounting in batches
(`accounting()` plays what is pending first): a batch runs with the accounting's data hot in the
CPU's caches, about half the cost of each event played between the ops, and a weakref callback
that the garbage collector runs in the middle of an allocation only appends to the log.

The block model starts when it is first needed: the first statistics asked for
(`memory_stats()`, `memory_reserved()`, `empty_cache()`, ...) or the first capture. Until then the
live storages are kept (with their size and stream) and each allocation and free moves a few
counters (caching_allocator.EarlyCounts), which costs eager code that never asks a fraction of the
model; when it starts, the storages alive then are its first blocks, in the order they were made,
and it takes the counters over: the peaks of allocations, allocated and requested bytes and the
totals ever allocated and freed go back to the first allocation, as on CUDA. The segments (and so
the reserved bytes and the split blocks) start there: the reserved peak is kept at least as high as
the allocated peak. While there have been at most EARLY_LOG allocations and frees before it
starts, they are kept in order instead and played into it as they happened, so the model starts
exactly where CUDA's allocator is, segments cached from earlier frees included (PyTorch's test
files allocate on the device at import).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Callable, Iterator

import torch

from harness.emulation.caching_allocator import Block, CachingAllocator, EarlyCounts
from harness.emulation.host_allocator import PinnedHostAllocator
from harness.emulation.unsafe_calls import is_capture_thread, refuse_device_malloc, refuses_unsafe_call
from harness.graphs.emulator.accesses import SPARSE_LAYOUTS, sparse_parts
from harness.graphs.emulator.pool import BLOCK_ATTR
from harness.torch_internals import functorch_get_unwrapped, is_functorch_wrapped_tensor

MEMORY_ATTR = "_harness_memory"
DEVICE = "device"
PINNED = "pinned"
PLAY_AT = 2048  # pending allocations that are played into the accounting at once
EARLY_LOG = 4096  # allocations and frees kept in order before the accounting starts


class _CallFlags(threading.local):
    """What the device op running on a thread says of its memory. Per thread, as a device op's
    own: a process-wide flag let a host factory on one thread make device memory while another
    thread's device op ran, and two threads' overlapping ops left it set for good (each put back
    what it found)."""

    call_on_device = False
    compiled_on_device = False
    # The outputs the device call running makes in host memory (a host_outputs.HostOutputs)
    host_outputs = None


class StorageRef(weakref.ref):
    """The one weak reference noting a device storage's death, shared by the allocator's model
    and the stream tracking: one object and one callback per storage, made for every result of
    every device op. It hashes by identity: a pending one may be looked up after its storage
    died, and a plain weakref hashes by its referent (an error once that is gone).

    `nbytes`: the allocation's bytes, for the live-bytes count and the model (0 for a storage
    without an allocation of its own, and once `release_storage` gave it back). The stream
    tracking sets the rest when it first sees the storage (mode.py): `on_free`, its call at the
    death (None until then), and `key`, `stream` and `size` (the storage's bytes), which it
    judges the free by."""

    __slots__ = ("nbytes", "on_free", "key", "stream", "size")
    __hash__ = object.__hash__
    __eq__ = object.__eq__


def _tell_tracking(ref: StorageRef) -> None:
    if ref.on_free is not None:
        ref.on_free(ref)


def death_watch(storage: torch.UntypedStorage) -> StorageRef:
    """A StorageRef for device memory without an allocation of its own (an alias, an empty
    storage): its death is only the stream tracking's to note."""
    ref = StorageRef(storage, _tell_tracking)
    ref.nbytes, ref.on_free = 0, None
    return ref


class HeldBlock:
    """Stands where a storage's weak reference stands for an allocation no storage owns: alive
    (calling it returns it) until released."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def __call__(self) -> "HeldBlock":
        return self


def memory_mark(x: torch.Tensor | torch.UntypedStorage) -> str | None:
    """Where a tensor, or an untyped storage, lives on the emulated device: DEVICE, PINNED, or None
    for pageable host memory (and for a tensor without a storage, nested). A torch.func wrapper
    (vmap's batched tensor) lives where the tensor it wraps does, a sparse tensor where its values
    do."""
    try:
        storage = x if type(x) is torch.UntypedStorage else x.untyped_storage()
    except (RuntimeError, NotImplementedError):
        storage = _storage(x)
        if storage is None:
            return None
    return getattr(storage, MEMORY_ATTR, None)


def is_device_memory(x: torch.Tensor | torch.UntypedStorage) -> bool:
    """Whether a tensor, or an untyped storage, is the emulated device's memory: the one answer
    every part of the device asks (a nested tensor, without a storage, is not)."""
    return memory_mark(x) is DEVICE


def is_wrapper_subclass(t: Any) -> bool:
    """Whether `t` is a traceable wrapper subclass (torchao's quantized weights, DTensor): its
    storage a placeholder without bytes, the tensors it holds (`wrapped_tensors`) the memory."""
    return (isinstance(t, torch.Tensor) and type(t) is not torch.Tensor
            and hasattr(type(t), "__tensor_flatten__"))


def wrapped_tensors(t: torch.Tensor) -> list[torch.Tensor] | None:
    """The tensors a traceable wrapper subclass holds (its `__tensor_flatten__`), None for any
    other tensor."""
    if not is_wrapper_subclass(t):
        return None
    names, _ = t.__tensor_flatten__()
    return [getattr(t, name) for name in names]


def own_storage(t: torch.Tensor) -> torch.UntypedStorage | None:
    """`t`'s own storage, None for a tensor without one (sparse, nested and other storage-less
    layouts, a torch.func wrapper): `storage_of` finds where those live."""
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


def _storage(t: torch.Tensor) -> torch.UntypedStorage | None:
    """`t`'s storage; a torch.func wrapper's is the wrapped tensor's (vmap and grad wrap tensors in
    ones without a storage, and the ops below them make the wrapped ones); a sparse tensor's is its
    values' (`sparse_parts`)."""
    storage = own_storage(t)
    if storage is not None:
        return storage
    if t.layout in SPARSE_LAYOUTS:  # a sparse tensor lives where its values do
        parts = sparse_parts(t)
        return parts[0].untyped_storage() if parts else None
    while storage is None and is_functorch_wrapped_tensor(t):
        t = functorch_get_unwrapped(t)
        storage = own_storage(t)
    return storage


def storage_of(t: torch.Tensor) -> torch.UntypedStorage | None:
    """The storage that says where `t` lives (its own; a sparse tensor's values'; a torch.func
    wrapper's wrapped tensor's), None for a tensor without one."""
    return _storage(t)


class DeviceMemory:
    """Which storages are device memory and which host memory is pinned; what the recorder asks
    (emulator/memory.py's interface) and what `torch.cuda.memory_allocated()` answers from."""

    all_device = False

    def __init__(self, current_stream: Callable[[], Any],
                 capture: Callable[[], Any] = lambda: None) -> None:
        """`capture()`: the graph being captured, or None (a new pinned block is refused under
        some captures, unsafe_calls.py)."""
        # CUDA's allocator keeps a DeviceCachingAllocator per device: device 0's here, and each
        # other device's, made at its first use (its pools, graph pools and MemPools included).
        self.allocator = CachingAllocator()
        self._allocators: dict[int, CachingAllocator] = {0: self.allocator}
        # The device whose capture is under way (one capture at a time): its capture streams'
        # allocations come from its capture pool.
        self._capturing: CachingAllocator | None = None
        self.host = PinnedHostAllocator(capture=capture)  # pinned memory: CUDA's caching host allocator
        self._capture = capture
        self._current_stream = current_stream
        self._blocks: dict[StorageRef, Block] = {}
        # Not yet played: (ref, nbytes, stream, graph pool or None) for an allocation, the ref for
        # a free, a Block for a free of the generator's seed or offset.
        self._pending: list = []
        self._playing = threading.RLock()  # one thread plays at a time; the others wait for it
        self._on_died = self._storage_died  # bound once: adopt() runs on every device allocation
        self._live = 0  # bytes of the device storages alive, counted without the accounting
        self._modelled = False  # whether the accounting has started (see the module docstring)
        self._unmodelled: dict[StorageRef, Any] = {}  # before it: live storage -> its stream
        # before it: what the allocations and frees moved, per device; device 0's logged as
        # they happen (n bytes allocated, ~n freed) and played into its counts in batches
        self._early = {0: EarlyCounts()}
        self._early_events: list[int] = []
        # Before it too: the first EARLY_LOG allocations and frees in order, so that the model
        # starts with the segments CUDA would hold then (freed ones stay cached); None once full.
        self._early_log: list | None = []
        # (thread id, device index) -> the Pool use_mem_pool routes that thread's allocations on
        # that device to (CUDA routes per device: beginAllocateCurrentThreadToPool(device, id))
        self.thread_pools: dict[tuple[int, int], Any] = {}
        # (thread id, device index) -> the graph pool's arena (a PoolArena) that thread's device
        # allocations are moved into as they are made (CUDA's beginAllocateCurrentThreadToPool
        # outside a capture: cudagraph trees' warm-ups and recording inputs), so their bytes
        # outlive them as a graph pool's do; `stream_key` tells the arena's segments apart
        self.thread_arenas: dict[tuple[int, int], Any] = {}
        self.stream_key: Callable[[Any], Any] = lambda stream: stream
        # Per thread: another thread's host work while this one runs a device op is host work.
        self._call_flags = self.call_flags = _CallFlags()  # call_flags: the hot path's own read
        # Told of each storage made device memory, with its StorageRef (None: no allocation), so
        # stream tracking learns the stream of memory that no op it saw returned
        # (`torch.as_tensor(x, device="cuda")` is made in C++).
        self.adoption_listeners: list = []
        # CUDA initializes at its first device tensor: torch.cuda.is_initialized() is True after.
        self.adopted_any = False

    # --- what a tensor is --------------------------------------------------------------------

    def is_device(self, t: torch.Tensor) -> bool:
        return is_device_memory(t)

    def is_pinned(self, t: torch.Tensor) -> bool:
        storage = _storage(t)
        return storage is not None and getattr(storage, MEMORY_ATTR, None) == PINNED

    def call_targets_device(self) -> bool:
        return self._call_flags.call_on_device

    def call_makes_host_outputs(self) -> bool:
        """Whether the device call running on this thread makes some outputs in host memory
        (a packed sequence's batch sizes: host_outputs.py)."""
        return self._call_flags.host_outputs is not None

    def makes_host_memory(self, func: Any) -> bool:
        """Whether the aten factory `func`, met inside the device call running on this thread,
        makes that call's host output (a packed sequence's lengths: host_outputs.py)."""
        host = self._call_flags.host_outputs
        return host is not None and func is host.factory

    @property
    def call_on_device(self) -> bool:
        """Set by the placement mode around a call that names the device (a factory with
        device="cuda", a copy to it) on the thread making it: the recorder cannot see the device
        once it is rewritten."""
        return self._call_flags.call_on_device

    @call_on_device.setter
    def call_on_device(self, value: bool) -> None:
        self._call_flags.call_on_device = value

    @property
    def compiled_on_device(self) -> bool:
        """Set while a compiled graph that works on device memory only runs its own code on this
        thread: the buffers it hands a user's op body are device memory (op_bodies.py)."""
        return self._call_flags.compiled_on_device

    @compiled_on_device.setter
    def compiled_on_device(self, value: bool) -> None:
        self._call_flags.compiled_on_device = value

    # --- marking -----------------------------------------------------------------------------

    def mark_device(self, t: torch.Tensor, stream: Any = None) -> None:
        if type(t) is torch.Tensor:  # the hot path: a dense result's own storage
            try:
                storage = t.untyped_storage()
            except (RuntimeError, NotImplementedError):
                pass  # sparse, nested, a torch.func wrapper: below
            else:
                if getattr(storage, MEMORY_ATTR, None) is not DEVICE:
                    self.adopt(storage, stream)
                return
        if t.layout in SPARSE_LAYOUTS:  # each part is an allocation of its own
            for part in sparse_parts(t):
                self.mark_device(part, stream)
            return
        inner = wrapped_tensors(t)
        if inner is not None:
            # A wrapper subclass made by a device op (its own dispatch ran the op on the tensors
            # it wraps, which no torch call of the device saw): they are the allocations, the
            # wrapper owns none, as on CUDA (wrapper_subclasses.py).
            for part in inner:
                self.mark_device(part, stream)
            self.mark_wrapper(t.untyped_storage())
            return
        if not is_device_memory(t):
            storage = _storage(t)
            if storage is not None:
                self.adopt(storage, stream)

    def adopt(self, storage: torch.UntypedStorage, stream: Any = None) -> None:
        """Mark `storage` device memory: an allocation on `stream` (the current stream for None),
        whose device's allocator holds it, while it lives."""
        ref = self._adopt(storage, stream)
        for listener in self.adoption_listeners:
            listener(storage, ref)

    def _adopt(self, storage: torch.UntypedStorage, stream: Any) -> StorageRef | None:
        """`adopt` without telling the listeners: the allocation's StorageRef, None for an empty
        storage."""
        setattr(storage, MEMORY_ATTR, DEVICE)
        self.adopted_any = True
        nbytes = storage.nbytes()
        if not nbytes:  # CUDA's allocator makes no block for an empty request
            return None
        ref = StorageRef(storage, self._on_died)
        ref.nbytes, ref.on_free = nbytes, None
        self._allocate(ref, nbytes, self._current_stream() if stream is None else stream)
        if self.thread_arenas:
            stream = self._current_stream() if stream is None else stream
            arena = self.thread_arenas.get(
                (threading.get_ident(), getattr(stream, "device_index", 0)))
            if arena is not None and getattr(storage, BLOCK_ATTR, None) is None:
                arena.take_over(storage, self.stream_key(stream))
        return ref

    def tracking_ref(self, storage: torch.UntypedStorage) -> StorageRef:
        """The StorageRef the stream tracking notes `storage`'s death by, `storage` made device
        memory first if it is not (an allocation on the current stream, the adoption listeners
        not told: the tracking asking is the one that listens): its allocation's, or for device
        memory without one, a ref of its own."""
        if getattr(storage, MEMORY_ATTR, None) is not DEVICE:
            ref = self._adopt(storage, None)
            if ref is not None:
                return ref
        else:  # device memory made before the tracking saw it: rare, once per storage
            for ref in weakref.getweakrefs(storage):
                if ref.__class__ is StorageRef:
                    return ref
        return death_watch(storage)

    def mark_alias(self, storage: torch.UntypedStorage,
                   of: torch.UntypedStorage | None = None) -> None:
        """Mark `storage`, which does not own its bytes, device memory with no allocation of its
        own, as CUDA's allocator makes none: one made from a data pointer into device memory, or
        a second storage over the memory of the device storage `of` (what cudagraph trees hand
        out over their pool), which holds the allocation and which the alias keeps alive."""
        setattr(storage, MEMORY_ATTR, DEVICE)
        if of is not None:
            storage._harness_alias_of = of
        for listener in self.adoption_listeners:
            listener(storage, None)

    @staticmethod
    def mark_wrapper(storage: torch.UntypedStorage) -> None:
        """Mark the placeholder storage of a wrapper subclass device memory: it has no bytes
        (`data_ptr()` refuses), so no allocation and nothing for the stream tracking to see."""
        setattr(storage, MEMORY_ATTR, DEVICE)

    def _allocate(self, ref, nbytes: int, stream) -> None:
        self._live += nbytes
        if not self._modelled:
            self._unmodelled[ref] = stream
            if getattr(stream, "device_index", 0):
                self._early_counts(stream).allocate(nbytes)
            else:
                events = self._early_events
                events.append(nbytes)
                if len(events) >= PLAY_AT:
                    self._count_early()
            if self._early_log is not None:  # asked here: every allocation passes
                self._log_early((ref, nbytes, stream))
            return
        pool = None
        capturing = self._capturing
        if capturing is not None and stream in capturing.capture_streams:
            pool = capturing.capture_pool
        if self.thread_pools:  # torch.cuda.use_mem_pool: this thread's allocations on a device
            pool = self.thread_pools.get(
                (threading.get_ident(), getattr(stream, "device_index", 0)), pool)
        if capturing is not None and pool is None:
            self._allocate_beside_a_capture(ref, nbytes, stream)
            return
        pending = self._pending
        pending.append((ref, nbytes, stream, pool))
        # While the history is recorded, each allocation is played at once: its trace entry and
        # its block's frames are the caller's stack now.
        if len(pending) >= PLAY_AT or self.allocator.history is not None:
            self._play()

    def _allocate_beside_a_capture(self, ref, nbytes: int, stream) -> None:
        """An allocation outside the capture's pool while a capture is under way, played at once:
        where it needs a new segment, CUDA's allocator calls cudaMalloc without the relaxed guard
        it takes for a capturing stream's allocation (`cudaMallocMaybeCapturing` asks the calling
        thread's current stream), a potentially unsafe call that a global capture refuses from
        another thread (unsafe_calls.py)."""
        self._play()
        allocator = self.device_allocator(getattr(stream, "device_index", 0))
        segments = len(allocator.segments)
        self._pending.append((ref, nbytes, stream, None))
        self._play()
        graph = self._capture()
        if (len(allocator.segments) > segments and graph is not None
                and not is_capture_thread(graph) and refuses_unsafe_call(graph, False)):
            refuse_device_malloc(graph, nbytes)

    def hold_block(self, nbytes: int, stream) -> "HeldBlock":
        """An allocation no storage owns (a library's workspace), made on `stream` now as a
        storage's would be, pool routing included, until `release_block`."""
        held = HeldBlock(nbytes)
        self._allocate(held, nbytes, stream)
        return held

    def hold_block_in(self, pool, nbytes: int, stream) -> "HeldBlock":
        """An allocation no storage owns, from `pool` (a Pool of the model), until
        `release_block`: a graph pool's block allocated again by a restored checkpoint."""
        held = HeldBlock(nbytes)
        self._live += nbytes
        self._pending.append((held, nbytes, stream, pool))
        self._play()
        return held

    def owns_allocation(self, storage: torch.UntypedStorage) -> bool:
        """Whether `storage` holds an allocation of the device's allocator (its death frees it):
        CUDA's storage with the caching allocator's deleter. One made from a data pointer, or
        released (`release_storage`), does not."""
        return any(ref.__class__ is StorageRef and ref.nbytes
                   for ref in weakref.getweakrefs(storage))

    def release_block(self, held: "HeldBlock") -> None:
        self._pending_free(held)

    @contextlib.contextmanager
    def thread_allocating_to(self, index: int, pool: Any) -> Iterator[None]:
        """This thread's allocations on device `index` come from `pool` (a Pool of that device's
        allocator) meanwhile, as CUDA's beginAllocateCurrentThreadToPool, endAllocateToPool and
        releasePool route them (`use_mem_pool`, a trees warm-up): the pool is in use for the
        duration, and a routing made before it is back after it."""
        allocator = self.accounting(index)
        key = (threading.get_ident(), index)
        previous = self.thread_pools.get(key)
        allocator.use_pool(pool)
        self.thread_pools[key] = pool
        try:
            yield
        finally:
            if previous is None:
                self.thread_pools.pop(key, None)
            else:
                self.thread_pools[key] = previous
            allocator.release(pool)

    def release_storage(self, storage: torch.UntypedStorage) -> None:
        """`storage`'s allocation goes back to its pool now, while the storage lives on (its
        death later frees nothing): what cudagraph trees do to the outputs of a generation that
        ended (`_free_And_Remove_DeleterFn`), and to a recording's outputs, whose blocks the
        tensors handed to the program hold rather than the recording. A storage without an
        allocation of its own (an alias) is left as it is."""
        for ref in weakref.getweakrefs(storage):
            if ref.__class__ is StorageRef and ref.nbytes:
                self._pending_free(ref)
                ref.nbytes = 0  # the free at its death: nothing left to count or free

    def adopt_in_pool(self, storage: torch.UntypedStorage, handle, pool_id: tuple[int, int]) -> None:
        """`storage`, an alias over memory of a graph pool (one the trees build from a pool
        pointer and hand to the program), holds a block of the pool the allocator's model keys by
        `handle` (CUDA's id `pool_id`) on the current stream's device until it dies, as the
        trees' checkpoint hands the block's deleter to the storage the program holds."""
        nbytes = storage.nbytes()
        if not nbytes:
            return
        allocator = self.accounting(getattr(self._current_stream(), "device_index", 0))
        ref = StorageRef(storage, self._on_died)
        ref.nbytes, ref.on_free = nbytes, None
        self._live += nbytes
        self._pending.append((ref, nbytes, self._current_stream(), allocator.pool_of(handle, pool_id)))
        self._play()

    def _storage_died(self, ref: StorageRef) -> None:
        # _pending_free inlined: every device storage's death passes here
        self._live -= ref.nbytes
        stream = self._unmodelled.pop(ref, None)
        if stream is None:
            self._pending.append(ref)
        else:  # it died before the model started
            if getattr(stream, "device_index", 0):
                self._early_counts(stream).free(ref.nbytes)
            else:
                events = self._early_events
                events.append(~ref.nbytes)
                if len(events) >= PLAY_AT:
                    self._count_early()
            if self._early_log is not None:
                self._log_early(ref)
        if ref.on_free is not None:
            ref.on_free(ref)  # the stream tracking's note of the free (mode.py)

    def _pending_free(self, ref: StorageRef) -> None:
        self._live -= ref.nbytes
        stream = self._unmodelled.pop(ref, None)
        if stream is None:
            self._pending.append(ref)
        else:  # it died before the model started
            if getattr(stream, "device_index", 0):
                self._early_counts(stream).free(ref.nbytes)
            else:
                self._early_events.append(~ref.nbytes)
                self._count_early()
            if self._early_log is not None:  # asked here: every free passes
                self._log_early(ref)

    def _log_early(self, event) -> None:
        log = self._early_log
        if log is not None:
            if len(log) < EARLY_LOG:
                log.append(event)
            else:  # from here the model starts from the live storages (module docstring)
                self._early_log = None

    def _count_early(self) -> None:
        """Play device 0's logged allocations and frees into its early counts."""
        with self._playing:
            while self._early_events:  # what callbacks add meanwhile: next
                events, self._early_events = self._early_events, []
                self._early[0].play(events)

    def _start_accounting(self) -> None:
        with self._playing:
            if self._modelled:
                return
            # Switched first: a storage that dies meanwhile is logged, and its free finds its
            # block (made below) or nothing (it died before it got one, and gets none). One that
            # died before the switch left the dict taken here, its free counted early.
            alive, self._unmodelled, self._modelled = self._unmodelled, {}, True
            log, self._early_log = self._early_log, None
            malloc, free, blocks = self._malloc, self._free, self._blocks
            if log is not None:  # the whole history: played as it happened
                for event in log:
                    if event.__class__ is tuple:
                        blocks[event[0]] = malloc(event[1], event[2], None)
                    else:
                        block = blocks.pop(event, None)
                        if block is not None:
                            free(block)
                return
            self._count_early()  # the counts so far, before the frees of the storages gone below
            for ref, stream in list(alive.items()):
                if ref() is not None:
                    blocks[ref] = malloc(ref.nbytes, stream, None)
                else:
                    self._early_counts(stream).free(ref.nbytes)
            for index, early in self._early.items():
                self.device_allocator(index).carry_over(early)

    def _play(self) -> None:
        blocks, malloc, free = self._blocks, self._malloc, self._free
        with self._playing:
            while self._pending:
                events, self._pending = self._pending, []  # what callbacks add meanwhile: next
                for event in events:
                    if event.__class__ is tuple:
                        blocks[event[0]] = malloc(event[1], event[2], event[3])
                    elif event.__class__ is Block:
                        free(event)
                    else:
                        block = blocks.pop(event, None)
                        if block is not None:
                            free(block)

    def _early_counts(self, stream) -> EarlyCounts:
        index = getattr(stream, "device_index", 0)
        early = self._early.get(index)
        if early is None:
            early = self._early[index] = EarlyCounts()
        return early

    def device_allocator(self, index: int) -> CachingAllocator:
        """Device `index`'s model (made at its first use)."""
        allocator = self._allocators.get(index)
        if allocator is None:
            allocator = self._allocators[index] = CachingAllocator(index)
            allocator.caching = self.allocator.caching
        return allocator

    def _malloc(self, nbytes: int, stream, pool) -> Block:
        """A block from `pool` (a graph pool or MemPool, of its device's model), or from the
        regular pool of the device `stream` is on (None)."""
        if pool is not None:
            return self._allocators[pool.device].malloc(nbytes, stream, pool)
        index = getattr(stream, "device_index", 0)
        if not index:
            return self.allocator.malloc(nbytes, stream, None)
        return self.device_allocator(index).malloc(nbytes, stream, None)

    def _free(self, block: Block) -> None:
        self._allocators[block.pool.device].free(block)

    def accounting(self, index: int = 0) -> CachingAllocator:
        """Device `index`'s caching allocator accounting, up to date (started now if it had not)."""
        if not self._modelled:
            self._start_accounting()
        self._play()
        return self.allocator if not index else self.device_allocator(index)

    def device_accountings(self) -> list[CachingAllocator]:
        """Every device's accounting that has been used, up to date, by device index."""
        self.accounting()
        return [self._allocators[i] for i in sorted(self._allocators)]

    def allocated_blocks(self, index: int = 0) -> list[Block]:
        """Device `index`'s blocks in use now (the accounting up to date): what a snapshot lists."""
        self.accounting(index)
        return [b for b in self._blocks.values() if b.pool.device == index]

    def mark_pinned(self, t: torch.Tensor) -> None:
        storage = _storage(t)
        if storage is not None and getattr(storage, MEMORY_ATTR, None) != PINNED:
            setattr(storage, MEMORY_ATTR, PINNED)
            self.adopted_any = True  # pinning initializes CUDA, as a device tensor does
            self.host.allocate(storage)

    # --- graph pools of a capture --------------------------------------------------------------

    def begin_capture_pool(self, handle, pool_id: tuple[int, int], stream, streams: set,
                           mem_pool=None) -> None:
        """A capture on `stream` into `handle`'s pool (CUDA's id `pool_id`) begins: as
        CUDAGraph::capture_begin, on the capture device's allocator (the device `stream` is on),
        the allocations on `streams` come from that device's pool of the id; `mem_pool` is the
        model's pool of a live MemPool of that id, which the capture shares when it is of the
        same device (on another device the id names a pool of that device's own)."""
        allocator = self.accounting(getattr(stream, "device_index", 0))
        if mem_pool is not None and mem_pool.device == allocator.device:
            allocator.share_pool(handle, mem_pool)
        allocator.begin_allocate_to_pool(handle, pool_id, streams)
        self._capturing = allocator

    def end_capture_pool(self) -> None:
        if self._capturing is not None:
            self._capturing.end_allocate_to_pool()
            self._capturing = None

    def release_capture_pool(self, device: int, handle) -> None:
        """A graph captured on `device` into `handle`'s pool was reset or destroyed."""
        self.device_allocator(device).release_pool(handle)

    # --- statistics --------------------------------------------------------------------------

    def live_bytes(self) -> int:
        """Bytes of the device storages alive now, as asked (no rounding): cheap enough for a
        check before every factory, where `allocated_bytes()` plays the pending log first."""
        return self._live

    def allocated_bytes(self) -> int:
        """Bytes of the blocks that device storages alive now hold (CUDA's allocated_bytes)."""
        return self.accounting().allocated_bytes()
