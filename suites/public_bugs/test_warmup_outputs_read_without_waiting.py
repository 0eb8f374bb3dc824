"""A graph runner warms up on its capture stream (to warm the pool it captures into) and hands the
warmup's output to the caller, who reads it on the current stream; nothing orders the current
stream after the warmup stream (PyTorch #113895, fixed in cudagraph trees by #117578: "After we
execute on the side stream we need to sync the current stream to the side stream", a
`torch.cuda.current_stream().wait_stream(stream)` after the warmup). On CUDA the caller may read the
output before the warmup wrote it, silently; the harness's stream tracking reports the race, naming
the read and the write. Fixed: the current stream waits for the warmup stream."""

from __future__ import annotations

import pytest
import torch

from harness.emulation import track_stream_races
from harness.emulation.tracking import RaceError

SIZE = 1 << 12


class WarmingRunner:
    def __init__(self, *, waits: bool) -> None:
        self.waits = waits
        self.stream = torch.cuda.Stream()
        self.weight = torch.linspace(1.0, 2.0, SIZE, device="cuda")
        torch.cuda.synchronize()  # the weights, before another stream reads them

    def warmup(self, x: torch.Tensor) -> torch.Tensor:
        self.stream.wait_stream(torch.cuda.current_stream())  # the inputs are ready
        with torch.cuda.stream(self.stream):
            out = x * self.weight + 1
        if self.waits:
            torch.cuda.current_stream().wait_stream(self.stream)
        return out


def _first_call(waits: bool) -> float:
    runner = WarmingRunner(waits=waits)
    x = torch.ones(SIZE, device="cuda")
    try:
        with track_stream_races():
            out = runner.warmup(x)
            total = out.sum()  # the caller's read, on the current stream
            torch.cuda.synchronize()
            return total.item()
    finally:
        torch.cuda.synchronize()


@pytest.mark.strict_races
def test_reading_the_warmup_output_without_waiting_is_a_race():
    with pytest.raises(RaceError, match="test_warmup_outputs_read_without_waiting.py") as caught:
        _first_call(waits=False)
    assert "out.sum()" in str(caught.value), caught.value


@pytest.mark.strict_races
def test_the_current_stream_waiting_for_the_warmup_reads_its_output():
    expected = (torch.linspace(1.0, 2.0, SIZE) + 1).sum().item()
    assert _first_call(waits=True) == pytest.approx(expected)
