"""A stream told to wait on an event that is recorded only later (SGLang #14169, "Delay vocab mask
fill instead of delaying sampling": the sampling kernel launched first, behind `wait()` on the
grammar mask's event, the event recorded once the host had the mask; "torch.cuda.Event will not wait
for an uninitialized event, so this wait() would not block the kernel execution on the device";
#14214 tried a value-based wait for it). `cudaStreamWaitEvent` orders the stream after the record
the event holds when the wait is issued: none for a new event (torch skips the wait), the previous
step's for an event reused across steps. Either way the sampler reads the vocab mask while the
mask stream still copies it in, on CUDA silently; the harness's stream tracking reports the race,
naming the read and the copy. Fixed: the wait is issued after the mask's record."""

from __future__ import annotations

import pytest
import torch

from harness.emulation import track_stream_races
from harness.emulation.tracking import RaceError

VOCAB = 1 << 12
ALLOWED = (5, 9)  # the grammar's tokens at each step


class GrammarSampler:
    def __init__(self, *, wait_after_record: bool, reuse_event: bool) -> None:
        self.wait_after_record = wait_after_record
        self.reuse_event = reuse_event
        self.mask_stream = torch.cuda.Stream()
        self.sample_stream = torch.cuda.Stream()
        self.logits = torch.linspace(1.0, 2.0, VOCAB, device="cuda")
        self.mask = torch.zeros(VOCAB, device="cuda")
        self.host_mask = torch.zeros(VOCAB).pin_memory()
        self.token = torch.zeros((), dtype=torch.int64, device="cuda")
        self.mask_ready = torch.cuda.Event()
        torch.cuda.synchronize()  # the buffers' zeros, before another stream writes them
        self._fill_mask(0)  # warmup: a reused event holds this record when step 0 waits
        torch.cuda.synchronize()

    def _fill_mask(self, allowed: int) -> None:
        """The grammar's bitmask for this step, copied in on the mask stream."""
        self.host_mask.fill_(float("-inf"))
        self.host_mask[allowed] = 0.0
        with torch.cuda.stream(self.mask_stream):
            self.mask.copy_(self.host_mask, non_blocking=True)
        self.mask_ready.record(self.mask_stream)

    def _sample(self) -> None:
        with torch.cuda.stream(self.sample_stream):
            self.token.copy_((self.logits + self.mask).argmax())

    def step(self, allowed: int) -> int:
        if not self.reuse_event:
            self.mask_ready = torch.cuda.Event()
        if self.wait_after_record:
            self._fill_mask(allowed)
            self.sample_stream.wait_event(self.mask_ready)
            self._sample()
        else:
            self.sample_stream.wait_event(self.mask_ready)  # launched ahead of the mask
            self._sample()
            self._fill_mask(allowed)
        self.sample_stream.synchronize()
        self.mask_stream.synchronize()  # the host refills host_mask at the next step
        return int(self.token)


def _tokens(**kwargs) -> list[int]:
    sampler = GrammarSampler(**kwargs)
    try:
        with track_stream_races():
            return [sampler.step(allowed) for allowed in ALLOWED]
    finally:
        torch.cuda.synchronize()


@pytest.mark.strict_races
@pytest.mark.parametrize("reuse_event", [False, True], ids=["new-event", "reused-event"])
def test_a_wait_issued_before_the_masks_record_is_a_race(reuse_event):
    with pytest.raises(RaceError, match="test_event_waited_before_its_record.py") as caught:
        _tokens(wait_after_record=False, reuse_event=reuse_event)
    assert "self.logits + self.mask" in str(caught.value), caught.value
    assert "self.mask.copy_(self.host_mask" in str(caught.value), caught.value


@pytest.mark.strict_races
@pytest.mark.parametrize("reuse_event", [False, True], ids=["new-event", "reused-event"])
def test_a_wait_after_the_record_samples_the_allowed_token(reuse_event):
    assert _tokens(wait_after_record=True, reuse_event=reuse_event) == list(ALLOWED)
