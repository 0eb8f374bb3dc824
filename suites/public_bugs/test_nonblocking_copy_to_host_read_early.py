"""A device-to-host copy made with `.to("cpu", non_blocking=True)` and read before the host waited
for it (vLLM #36013: `num_accepted_tokens` read from a pinned copy before it landed). CUDA pins the
result of a non-blocking copy to the host and returns at once, so the host reads whatever the copy
has not written yet. The harness's stream tracking reports the read, naming the copy's line and the
read's. Fixed: record an event after the copy and synchronize it before reading."""

from __future__ import annotations

import pytest
import torch

from harness.emulation import emulation_active, track_stream_races
from harness.emulation.tracking import RaceError


def _needs_the_emulated_streams() -> None:
    # Over a real GPU, track_stream_races() is a CSAN-like mode that sees CUDA tensors only, not
    # the host's reads and writes of pinned memory: the race would go unreported there.
    if emulation_active() != "cpu":
        pytest.skip("host accesses of pinned memory are tracked on the emulated device only")


class Sampler:
    def __init__(self) -> None:
        self.logits = torch.eye(16, device="cuda")[torch.tensor([3, 7, 1, 12], device="cuda")]

    def accepted_tokens(self, *, wait: bool) -> list[int]:
        accepted = self.logits.argmax(-1).to(torch.int32)
        on_host = accepted.to("cpu", non_blocking=True)
        if wait:
            done = torch.cuda.Event()
            done.record()
            done.synchronize()
        return on_host.tolist()


def test_the_copy_to_the_host_is_pinned_as_on_cuda():
    accepted = torch.ones(4, device="cuda").to("cpu", non_blocking=True)
    assert accepted.is_pinned()
    assert accepted.device.type == "cpu"


@pytest.mark.strict_races
def test_reading_the_copy_before_waiting_is_a_race():
    _needs_the_emulated_streams()
    with pytest.raises(RaceError, match="test_nonblocking_copy_to_host_read_early.py") as caught:
        with track_stream_races():
            Sampler().accepted_tokens(wait=False)
    assert "host read before the device work" in str(caught.value)


@pytest.mark.strict_races
def test_reading_after_the_event_gives_the_device_values():
    with track_stream_races():
        assert Sampler().accepted_tokens(wait=True) == [3, 7, 1, 12]
