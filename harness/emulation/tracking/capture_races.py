"""Races between the branches of one capture. A stream forked into a capture becomes a branch of
the graph that runs concurrently with the capturing stream's later nodes until a join orders them;
two nodes touching the same memory, one writing, with no fork or join between them, race at every
replay. The usual way in is the caching allocator: a block freed on the capturing stream while a
forked stream still reads it, without `record_stream`, is handed to the capturing stream's next
allocation during the same capture (PyTorch defers only blocks with recorded streams), and the
next node writes it while the side branch reads it. Each captured op is checked against the
capture's own clocks (forks and joins as CUDA records them), by a tracker of its own that reports
to the device's tracker; the whole replay is checked against other streams' work elsewhere."""

from __future__ import annotations

from typing import Any

import torch

from harness import torch_internals
from harness.graphs.emulator.accesses import split_accesses, tensors_of
from harness.graphs.emulator.callsite import current_callsite
from harness.emulation.tracking.names import ShapeLabels
from harness.emulation.tracking.op_plans import OpPlans
from harness.emulation.tracking.tracker import StreamTracker


class CaptureRaces:
    """The accesses of one capture's ops; `clocks` are the capture's (CaptureStreams')."""

    def __init__(self, device_tracker: StreamTracker, memory: Any) -> None:
        self.tracker = StreamTracker(mode=device_tracker.mode)
        # Reported where the device's races are: one list, one label table.
        self.tracker.reports = device_tracker.reports
        self.tracker.labels = device_tracker.labels
        self.clocks = self.tracker.clocks
        self._memory = memory
        self._plans = OpPlans()
        self._labels = ShapeLabels()

    def op(self, stream: int, func, args: tuple, kwargs: dict, out: Any) -> int:
        """Check the op that just ran on captured `stream`; returns its seq. Its fresh results
        are writes: memory the allocator may have handed back from a tensor freed during the
        capture. A result sharing an argument's storage (a view, `to` that copies nothing) is
        not."""
        if isinstance(func, torch_internals.HigherOrderOperator):
            # A higher-order operator: what it runs underneath is the recorder's, not seen here.
            return self.tracker.launch(stream, op=str(func), where=current_callsite())
        device = self._memory.is_device
        plan = self._plans.get(func)
        if plan.written:
            reads, writes = split_accesses(func, args, kwargs, device)
        else:
            reads, writes = [t for t in tensors_of((*args, *kwargs.values())) if device(t)], []
        labels = self.tracker.labels
        read_keys = [self._key(t, labels) for t in reads]
        write_keys = [self._key(t, labels) for t in writes]
        if plan.touches_results:
            argument_keys = {*read_keys, *write_keys}
            for t in tensors_of((out,)):
                if device(t) and t.untyped_storage().data_ptr() not in argument_keys:
                    write_keys.append(self._key(t, labels))
        return self.tracker.launch(stream, read_keys, write_keys, op=f"captured {plan.name}",
                                   where=current_callsite())

    def _key(self, t: torch.Tensor, labels: dict) -> int:
        key = t.untyped_storage().data_ptr()
        if key not in labels:
            labels[key] = self._labels.of(t)
        return key
