"""A multi-stream attention prologue hands tensors made on an auxiliary stream to the stream that
reads them, ordered with events but without `record_stream` (TensorRT-LLM PR #15265,
https://github.com/NVIDIA/TensorRT-LLM/pull/15265: DeepSeek-V4 MLA overlap, a use-after-free
under large-batch workspace pressure). The events order the kernels, not the caching allocator:
once the program drops the handed-off tensor, its block is free for the auxiliary stream's next
allocation (the next layer's), which may overwrite it while the reading stream's kernel is still
queued. On CUDA that is silent corruption or an illegal address, seen only under load. The
harness's stream tracking reports the free as a race, naming both lines. Fixed: the reader's
stream is recorded on the tensor (`record_stream`) before it is dropped."""

from __future__ import annotations

import pytest
import torch

from harness.emulation import track_stream_races
from harness.emulation.tracking import RaceError


class Prologue:
    """An overlapped prologue over layers: the auxiliary stream prepares each layer's weights
    ahead, the indexer stream reads them once each is ready; the main stream joins both at the
    end."""

    def __init__(self, record: bool) -> None:
        self.record = record
        self.aux = torch.cuda.Stream()
        self.indexer = torch.cuda.Stream()

    def run(self, x: torch.Tensor, layers: int = 2) -> torch.Tensor:
        main = torch.cuda.current_stream()
        self.aux.wait_stream(main)
        self.indexer.wait_stream(main)
        outputs = []
        try:
            for layer in range(layers):
                with torch.cuda.stream(self.aux):
                    weights = x * (layer + 2)  # a block of the aux stream
                    prepared = torch.cuda.Event()
                    prepared.record()
                with torch.cuda.stream(self.indexer):
                    self.indexer.wait_event(prepared)
                    if self.record:
                        weights.record_stream(self.indexer)
                    outputs.append(weights @ weights)
                del weights  # back to the aux stream's free blocks: the next layer's may take it
        finally:  # the step's end joins both streams, reported race or not
            main.wait_stream(self.indexer)
            main.wait_stream(self.aux)
            torch.cuda.synchronize()
        return sum(outputs)


def _steps(record: bool) -> torch.Tensor:
    x = torch.ones(64, 64, device="cuda")
    with track_stream_races():
        return Prologue(record).run(x)


@pytest.mark.strict_races
def test_dropping_the_handed_off_tensor_without_record_stream_is_a_race():
    with pytest.raises(RaceError, match="test_aux_stream_output_freed_under_its_reader.py"):
        _steps(record=False)


@pytest.mark.strict_races
def test_the_recorded_handoff_reads_the_prepared_weights():
    out = _steps(record=True)
    expected = (2 * 2 * 64) + (3 * 3 * 64)
    assert bool((out == expected).all())
