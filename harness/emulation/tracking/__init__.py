"""Asynchrony on the emulated device: vector clocks of streams, events and the host (`clocks.py`),
per-storage last writer and readers checked against them (`tracker.py`), blocks freed while
another stream's access was pending until memory made of them is touched (`freed_blocks.py`), and
what a race report says (`races.py`). The tracker is pure: it takes stream, event and storage ids, so it can be
driven by the emulated device, by a graph replay, or by a test with synthetic ids."""

from harness.emulation.tracking.clocks import HOST, Clocks
from harness.emulation.tracking.races import (Access, RaceError, RaceKind, RaceReport,
                                                   RaceWarning, TensorLabel)
from harness.emulation.tracking.tracker import StreamTracker

__all__ = ["HOST", "Access", "Clocks", "RaceError", "RaceKind", "RaceReport", "RaceWarning", "StreamTracker",
           "TensorLabel"]
