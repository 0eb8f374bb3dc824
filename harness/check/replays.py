"""Counting the graph captures and replays a region issues: the check that a runtime's steps ran
through its CUDA graphs and not through a silent eager fallback (a graph registered under one key
and looked up under another, a batch past the largest captured size). CUDA accepts the eager step
as correct, so nothing refuses it and its generations compare equal; only a count shows it.

    with harness.emulate_cuda(), count_replays() as counted:
        runtime.generate(requests)
    assert counted.replays == decode_steps, counted

It counts `torch.cuda.CUDAGraph` captures and replays (`torch.cuda.graph`,
`make_graphed_callables` and code calling `capture_begin`/`replay` directly) on the emulated CUDA
device and in the graph sanitizer: both tell their observers of each (emulation/state.py).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Iterator

from harness.emulation.active import active_state, emulation_active


class ReplayCount:
    """What `count_replays()` yields: `captures` (completed ones), `replays`, and `per_graph`
    (replays of each graph object, in the order of their first replay)."""

    def __init__(self) -> None:
        self._captures = 0
        # One entry per graph object: a weak reference (the count must not keep a graph, and so
        # its pool, alive) and its replays; an id reused by a later graph starts a new entry.
        self._graphs: list[list] = []
        self._by_id: dict[int, list] = {}

    @property
    def captures(self) -> int:
        return self._captures

    @property
    def replays(self) -> int:
        return sum(count for _, count in self._graphs)

    @property
    def per_graph(self) -> tuple[int, ...]:
        return tuple(count for _, count in self._graphs)

    # --- the device's observer interface (emulation/state.py) --------------------------------

    def on_capture_end(self, graph, aborted: bool) -> None:
        if not aborted:
            self._captures += 1

    def on_replay(self, graph, stream) -> None:
        entry = self._by_id.get(id(graph))
        if entry is None or entry[0]() is not graph:
            entry = self._by_id[id(graph)] = [weakref.ref(graph), 0]
            self._graphs.append(entry)
        entry[1] += 1

    def __repr__(self) -> str:
        return (f"ReplayCount(captures={self.captures}, replays={self.replays}, "
                f"per_graph={self.per_graph})")


@contextlib.contextmanager
def count_replays() -> Iterator[ReplayCount]:
    """Count the captures and replays of `torch.cuda` graphs issued inside the region."""
    if emulation_active() is None:
        raise RuntimeError("count_replays() counts the graphs of harness.emulate_cuda(), which is "
                           "not active: enter it first (`with harness.emulate_cuda():`, or run "
                           "pytest with --emulate-cuda)")
    counted = ReplayCount()
    with active_state().observe(counted):
        yield counted
