"""`harness.emulation.track_stream_races()`: one call that checks stream order on the emulated
device (its own tracking) and over a real GPU's streams (natively or in the graph sanitizer,
where nothing else sees the GPU run a side stream's read before the main stream's write)."""

from __future__ import annotations

import pytest
import torch

import harness
from harness.emulation import emulation_active, track_stream_races
from harness.emulation.tracking import RaceError


def _on_a_real_gpu() -> bool:
    return emulation_active() != "cpu" and torch.cuda.is_available()


# What both trackers report: the side stream's read, at the user's line, of the main stream's write.
RACE = r"aten\.add\.Tensor reads it on stream \d+ at .*test_track_stream_races\.py:\d+: result = hidden \+ 1"


def _unwaited_read(wait_with: str | None) -> torch.Tensor:
    side = torch.cuda.Stream()
    hidden = torch.ones(1 << 12, device="cuda") * 2
    if wait_with == "wait_stream":
        side.wait_stream(torch.cuda.current_stream())
    elif wait_with == "event":
        done = torch.cuda.Event()
        done.record()
        side.wait_event(done)
    elif wait_with == "synchronize":
        torch.cuda.current_stream().synchronize()
    with torch.cuda.stream(side):
        result = hidden + 1
    torch.cuda.current_stream().wait_stream(side)
    return result


def test_a_bad_mode_is_named():
    with pytest.raises(ValueError, match=r"races='loud'.*accepted: strict, report"):
        with track_stream_races(races="loud"):
            pass


def test_on_the_emulated_device_its_own_tracking_answers():
    if _on_a_real_gpu():
        pytest.skip("the emulated CUDA device is checked without a GPU")
    with harness.emulate_cuda(device="cpu") if emulation_active() is None else _nothing():
        with pytest.raises(RaceError, match=RACE):
            with track_stream_races():
                _unwaited_read(None)


def test_an_emulated_device_without_tracking_is_refused():
    if emulation_active() is not None or torch.cuda.is_available():
        pytest.skip("enters emulate_cuda(device='cpu') itself, without a GPU")
    with harness.emulate_cuda(device="cpu", races="off"):
        with pytest.raises(ValueError, match="races='off': its streams are not tracked"):
            with track_stream_races():
                pass


def _nothing():
    import contextlib

    return contextlib.nullcontext()


@pytest.mark.gpu
@pytest.mark.parametrize("where", ["native", "sanitizer"])
def test_real_streams_are_tracked(where):
    if not _on_a_real_gpu():
        pytest.skip("real streams need a real GPU")
    outer = harness.emulate_cuda() if where == "sanitizer" and emulation_active() is None else _nothing()
    if where == "native" and emulation_active() is not None:
        pytest.skip("the session is in the graph sanitizer")
    with outer:
        with pytest.raises(RaceError, match=RACE):
            with track_stream_races():
                _unwaited_read(None)
        for wait_with in ("wait_stream", "event", "synchronize"):
            with track_stream_races() as tracker:
                result = _unwaited_read(wait_with)
                assert result.sum().item() == 3.0 * (1 << 12)
            assert tracker.reports == [], (wait_with, tracker.reports)
        with track_stream_races(races="report") as tracker:
            _unwaited_read(None)
            torch.cuda.synchronize()
        assert len(tracker.reports) == 1, tracker.reports
