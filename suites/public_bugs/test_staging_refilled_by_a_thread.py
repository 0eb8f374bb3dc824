"""A pinned staging buffer refilled by a second thread (an input-preparation worker) while the
step's non-blocking host-to-device copy from it is still queued (vLLM #24527, #25279: CPU tensors
rewritten before their async copies ran). On CUDA the copy reads the refilled values, silently.
The race is met on the worker thread; the harness fails the step's own thread with it (an error
ending a worker thread alone would pass the test). Fixed: the worker waits for the event recorded
after the copy before refilling."""

from __future__ import annotations

import threading

import pytest
import torch

from harness.emulation import emulation_active, track_stream_races
from harness.emulation.tracking import RaceError


def _needs_the_emulated_streams() -> None:
    # Over a real GPU, track_stream_races() is a CSAN-like mode that sees CUDA tensors only, not
    # the host's reads and writes of pinned memory: the race would go unreported there.
    if emulation_active() != "cpu":
        pytest.skip("host accesses of pinned memory are tracked on the emulated device only")


class Runner:
    def __init__(self) -> None:
        self.staging = torch.zeros(1 << 12, dtype=torch.int32).pin_memory()
        self.input_ids = torch.zeros(1 << 12, dtype=torch.int32, device="cuda")
        self.copied = torch.cuda.Event()

    def step(self, tokens: int, *, worker_waits: bool) -> int:
        self.staging.fill_(tokens)
        self.input_ids.copy_(self.staging, non_blocking=True)
        self.copied.record()

        def prepare_next() -> None:
            if worker_waits:
                self.copied.synchronize()
            self.staging.fill_(tokens + 1)  # the next step's batch

        worker = threading.Thread(target=prepare_next)
        worker.start()
        worker.join()
        return int(self.input_ids.sum().item())


# The race also ends the worker thread (where it was met), which pytest reports as a warning.
@pytest.mark.strict_races
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_worker_refilling_the_queued_staging_buffer_fails_the_step():
    _needs_the_emulated_streams()
    with pytest.raises(RaceError, match="host write while device work on the memory is pending") \
            as caught:
        with track_stream_races():
            Runner().step(1, worker_waits=False)
    assert "test_staging_refilled_by_a_thread.py" in str(caught.value)


@pytest.mark.strict_races
def test_a_worker_that_waits_for_the_copy_leaves_the_step_its_tokens():
    with track_stream_races():
        assert Runner().step(1, worker_waits=True) == 1 << 12
