"""The graph sanitizer's races between the branches of one capture (emulation/sanitizer_races.py),
driven on a CPU: the sanitizer itself needs a GPU, but the judge it adds needs only the ops, the
streams they ran on and the capture's forks and joins (events recorded and waited on). A block
freed on the capturing stream and handed to its next result while a forked branch still reads it
races (the MoE shared-expert bug of suites/public_bugs); joined first, it does not."""

from __future__ import annotations

import types

import pytest
import torch

from harness.emulation.sanitizer_races import SanitizerCaptureRaces
from harness.emulation.tracking import RaceError
from harness.emulation.tracking.real_streams import RealStreamWork, StreamIds
from harness.emulation.tracking.tracker import StreamTracker

MUL, SUM = torch.ops.aten.mul.Tensor, torch.ops.aten.sum.default


class _EveryTensorIsDevice:
    @staticmethod
    def is_device(t: torch.Tensor) -> bool:
        return True


def _stream(stream_id: int):
    return types.SimpleNamespace(device_index=0, stream_id=stream_id)


def _over(storage_of: torch.Tensor) -> torch.Tensor:
    """A new result the allocator placed in `storage_of`'s freed block."""
    return torch.empty(0).set_(storage_of.untyped_storage(), 0, storage_of.shape)


def _capture(*, join_before_reuse: bool, races: str = "strict") -> StreamTracker:
    tracker = StreamTracker(mode=races)
    judge = SanitizerCaptureRaces(RealStreamWork(tracker, StreamIds()), _EveryTensorIsDevice())
    main, aux = _stream(3), _stream(4)
    fork, join = object(), object()
    x = torch.arange(8.0)
    hidden = x * 2
    judge.op(main, MUL, (x, 2), {}, hidden)
    judge.record_event(fork, main)
    judge.wait_event(aux, fork)
    judge.op(aux, SUM, (hidden,), {}, hidden.sum())  # the branch reads it
    if join_before_reuse:
        judge.record_event(join, aux)
        judge.wait_event(main, join)
    judge.op(main, MUL, (x, 3), {}, _over(hidden))  # hidden dropped: its block, reused
    return tracker


def test_a_block_reused_while_a_forked_branch_reads_it_is_a_race():
    with pytest.raises(RaceError, match="captured"):
        _capture(join_before_reuse=False)


def test_in_report_mode_the_race_is_collected_naming_both_ops_and_lines():
    with pytest.warns(Warning, match="race on tensor"):
        reports = _capture(join_before_reuse=False, races="report").reports
    assert len(reports) == 1
    text = str(reports[0])
    assert "captured aten.mul.Tensor writes it" in text and "captured aten.sum.default reads it" in text
    assert text.count("test_sanitizer_capture_races.py:") == 2


def test_the_block_reused_after_the_join_is_no_race():
    assert _capture(join_before_reuse=True, races="report").reports == []
