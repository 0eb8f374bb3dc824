"""What queued work keeps alive of the caller's memory.

Work waiting in a stream's queue (the adversarial schedule, or behind `torch.cuda._sleep`) runs
later on the memory it was issued with, so the emulator keeps that memory alive until it runs: a
queued op holds aliases of its tensors, a queued graph replay the storages its recording uses but
does not own (it writes through raw pointers; memory the host freed under it is the host's heap).
CUDA keeps nothing alive for it: the caller's free gives the block back to the caching allocator at
once, stream-ordered. So whether the caller still has a storage is told here by its uses: a live
storage's Python object holds one use, each queued alias another, and a queued replay that keeps
the Python object holds none of its own. What is left is the caller's.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from harness import torch_internals


class QueuedHolds:
    def __init__(self) -> None:
        self._aliases: dict[int, int] = {}  # storage key (data_ptr) -> aliases queued ops hold
        self._replays: dict[int, int] = {}  # storage key -> queued replays holding the storage

    def __bool__(self) -> bool:
        """Whether queued work holds anything (a launch with nothing queued need not ask)."""
        return bool(self._aliases or self._replays)

    def aliases(self, key: int) -> int:
        return self._aliases.get(key, 0)

    def holds(self, key: int) -> bool:
        """Whether queued work holds the storage at `key` (an alias or a replay's hold)."""
        return key in self._aliases or key in self._replays

    def alias(self, key: int) -> None:
        """A queued op holds one more alias (a tensor, one use) of the storage at `key`."""
        self._aliases[key] = self._aliases.get(key, 0) + 1

    def release_aliases(self, keys: Iterable[int]) -> None:
        _forget(self._aliases, keys)

    def hold_for_replay(self, storages: list[torch.UntypedStorage]) -> Callable[[], None]:
        """A queued replay keeps `storages` (the list, emptied once it ran): the call that
        forgets them."""
        keys = [s.data_ptr() for s in storages]
        for key in keys:
            self._replays[key] = self._replays.get(key, 0) + 1

        def release() -> None:
            _forget(self._replays, keys)
            keys.clear()
            storages.clear()

        return release

    def caller_dropped(self, storage: torch.UntypedStorage) -> bool:
        """Whether queued work holds `storage` and nothing else does: the caller dropped its last
        tensor on it, which on CUDA freed the memory. False for memory no queued work holds (its
        liveness is its own, `StorageWeakRef`)."""
        key = storage.data_ptr()
        aliases = self._aliases.get(key, 0)
        if not aliases and not self._replays.get(key):
            return False
        uses = torch_internals.storage_use_count(torch_internals.storage_key(storage))
        return uses - 1 <= aliases


def _forget(counts: dict[int, int], keys: Iterable[int]) -> None:
    for key in keys:
        left = counts.get(key, 1) - 1
        if left:
            counts[key] = left
        else:
            counts.pop(key, None)
