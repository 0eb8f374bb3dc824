"""Blocks freed during a capture after `record_stream`, as CUDA's caching allocator holds them.

Outside a capture the allocator frees such a block once events recorded on each stream that used
it have completed. Inside one it cannot record or query events, so (c10's CUDACachingAllocator):

- by default the block waits for the capture's end (`deferred_blocks`) and nothing in the capture
  reuses its bytes;
- with `graph_capture_record_stream_reuse:True` (`torch.cuda.memory._set_allocator_settings`), its
  free notes where each stream that used it had got to in the capture, and an allocation reuses it
  once the allocating stream has joined all of them (waited on each, directly or through another
  stream or an event), since the graph then orders the reuse after every use.

`CaptureFrees` follows one capture as an observer of the device state (state.py): each device op
on a stream in the capture is a launch on that stream's clock (tracking/clocks.py), waits and
events join clocks, `record_stream` notes a use of a pool block. When a used block's storage dies,
the pool arena (graphs/emulator/pool.py) is told when its bytes may go: at once after the capture,
and during it as above, at an allocation on the stream the block was made on (CUDA keeps free
blocks per stream). The arena has no streams: a block released at such an allocation is free for
every stream from then on, where CUDA's allocator would keep it for that stream.

Not modelled: the allocator's statistics keep counting the block as freed when its tensor dies
(caching_allocator.py, which does not model record_stream), and `PYTORCH_CUDA_ALLOC_CONF` setting
the option at start-up (only `_set_allocator_settings` while the emulation is active).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from harness.emulation.cuda_streams import queue_of
from harness.emulation.tracking.clocks import Clocks
from harness.graphs.emulator.pool import block_of

OPTION = "graph_capture_record_stream_reuse"


def stream_key(stream: Any) -> int:
    device, queue = queue_of(stream)  # a wrapper of a stream's handle is that stream's queue
    return (device << 40) | queue


def parse_settings(settings: str) -> dict[str, bool]:
    """The options of an allocator settings string ("key:value,key:value") the emulated device
    acts on; other keys are left to torch's own parser."""
    found = {}
    for item in settings.split(","):
        key, _, value = item.strip().partition(":")
        if key.strip() == OPTION:
            value = value.strip()
            if value not in ("True", "False"):
                raise RuntimeError(f"Expected a single True/False argument for {OPTION}, got "
                                 f"{value!r} in {settings!r}")
            found[OPTION] = value == "True"
    return found


def unmodelled_settings(settings: str) -> list[str]:
    """The keys of an allocator settings string that the emulated device's allocator model does
    not act on (each changes CUDA's segments, and so its memory statistics, not the results)."""
    keys = [item.strip().partition(":")[0].strip() for item in settings.split(",")]
    return [key for key in keys if key and key != OPTION]


class CaptureFrees:
    """One capture's stream clocks and the record_stream uses of its pool blocks."""

    def __init__(self, state: Any, *, reuse_after_join: bool) -> None:
        self._state = state
        self._reuse_after_join = reuse_after_join
        self._clocks = Clocks()
        self._over = False
        # id(storage) -> (its weak reference, which fires at the free; the streams that used it)
        self._used: dict[int, tuple[weakref.ref, set[int]]] = {}
        # pool block -> the stream it was made on: only that stream's allocations reuse it
        self._made_on: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()

    # --- the device state's observer interface -------------------------------------------------

    def on_op(self, op, args, kwargs, result, stream) -> None:
        if stream in self._state.streams.capturing:
            self._clocks.launch(stream_key(stream))
            for out in (result if isinstance(result, (tuple, list)) else (result,)):
                if isinstance(out, torch.Tensor):
                    block = block_of(out)
                    if block is not None and block not in self._made_on:
                        self._made_on[block] = stream_key(stream)

    def on_stream(self, what: str, stream, other) -> None:
        clocks = self._clocks
        if what == "wait_stream":
            clocks.wait_stream(stream_key(stream), stream_key(other))
        elif what == "wait_event":
            if other.recorded_on is not None:
                clocks.wait_event(stream_key(stream), other.key)
        elif what == "record_event":
            clocks.record_event(other.key, stream_key(stream))
        elif what == "record_stream":
            self._record_stream(other, stream)

    # --- the capture's end -------------------------------------------------------------------

    def end(self) -> None:
        """The capture is over: every held block may go, and later frees are not held."""
        self._over = True
        self._used.clear()
        self._made_on.clear()

    # -----------------------------------------------------------------------------------------

    def _record_stream(self, tensor, stream) -> None:
        block = block_of(tensor)
        if block is None:  # not the capture's memory: freed outside it, by the device's rules
            return
        storage = tensor.untyped_storage()
        entry = self._used.get(id(storage))
        if entry is None or entry[0]() is not storage:
            entry = self._used[id(storage)] = (
                weakref.ref(storage, lambda _, key=id(storage), b=block: self._freed(key, b)),
                set())
        entry[1].add(stream_key(stream))

    def _freed(self, key: int, block) -> None:
        entry = self._used.pop(key, None)
        if entry is None or self._over:
            return
        reached = {use: self._clocks.last(use) for use in entry[1]}
        home = self._made_on.get(block, stream_key(self._state.streams.current()))
        block.reusable = lambda: self._reusable(home, reached)

    def _reusable(self, home: int, reached: dict[int, int]) -> bool:
        if self._over:
            return True
        if not self._reuse_after_join:
            return False
        here = stream_key(self._state.streams.current())
        return here == home and all(self._clocks.ordered(here, use, seq)
                                    for use, seq in reached.items())
