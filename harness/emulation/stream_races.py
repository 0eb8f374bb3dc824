"""`track_stream_races()`: race tracking for code that runs on the emulated device or on a real
GPU alike. The emulated device tracks its streams itself, by its `races=` setting, from the
moment it is entered; over a real GPU (natively, or in the graph sanitizer, whose streams are the
GPU's) the real streams are tracked for the duration (tracking/real_streams.py)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from harness.emulation.active import active_state, emulation_active
from harness.emulation.tracking.tracker import MODES, StreamTracker


@contextlib.contextmanager
def track_stream_races(*, races: str = "strict") -> Iterator[StreamTracker]:
    """Races between streams raise `RaceError` at the op (`races="strict"`) or are collected in
    the yielded tracker's `reports` (`"report"`)."""
    if races not in MODES:
        raise ValueError(f"track_stream_races(races={races!r}); accepted: {', '.join(MODES)}")
    if emulation_active() == "cpu":
        tracking = active_state().streams_tracking
        if tracking is None:
            raise ValueError(f"track_stream_races(races={races!r}) on the emulated device entered "
                             f"with races='off': its streams are not tracked; enter "
                             f"emulate_cuda(races={races!r})")
        if tracking.work.tracker.mode != races:
            raise ValueError(f"track_stream_races(races={races!r}) on the emulated device entered "
                             f"with races={tracking.work.tracker.mode!r}: it tracks by its own "
                             f"setting; enter emulate_cuda(races={races!r}) or ask for that mode")
        yield tracking.work.tracker
        return
    if not torch.cuda.is_available():
        raise RuntimeError("track_stream_races() needs a GPU or the emulated CUDA device "
                           "(harness.emulate_cuda()); torch.cuda.is_available() is False")
    from harness.emulation.tracking.real_streams import track_real_streams

    with track_real_streams(races=races) as tracker:
        yield tracker
