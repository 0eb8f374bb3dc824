"""Work on a side stream reads what the main stream writes, with no event or wait_stream between
them (SGLang #18746). The harness's stream tracking reports the race, naming both ops and lines:
the emulated device's own on a CPU, the real streams' over a GPU (natively or in the graph
sanitizer, where the GPU runs the streams and would let the race through silently). Fixed: the
side stream waits for the main stream first."""

from __future__ import annotations

import pytest
import torch

from harness.emulation import track_stream_races
from harness.emulation.tracking import RaceError


def _overlap(wait: bool) -> torch.Tensor:
    with track_stream_races():
        return _step(wait)


def _step(wait: bool) -> torch.Tensor:
    side = torch.cuda.Stream()
    hidden = torch.ones(1 << 12, device="cuda") * 2
    if wait:
        side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        result = hidden + 1
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    return result


@pytest.mark.strict_races
def test_a_side_stream_reading_unwaited_work_is_a_race():
    with pytest.raises(RaceError, match="test_side_stream_without_wait.py"):
        _overlap(wait=False)


@pytest.mark.strict_races
def test_the_side_stream_that_waits_reads_the_producers_values():
    assert _overlap(wait=True).sum().item() == 3.0 * (1 << 12)
