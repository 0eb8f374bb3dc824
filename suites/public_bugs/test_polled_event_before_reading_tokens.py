"""An async-output step that polls a CUDA event with `query()` instead of blocking on it, then reads
the sampled tokens from a pinned buffer (vLLM #36013's `num_accepted_tokens`, SGLang's overlap
scheduler, `streams-and-async` in the reference notes). On CUDA an event whose `query()` answered
True has completed: the host may read what the work before it wrote. The buggy runtime polls the
forward's event, recorded on the main stream before the copy stream issued the device-to-host copy,
so the copy may still be pending when the host reads: a `RaceError` naming the copy and the read.
Fixed: it polls the copy stream's event. Until 2026-12-06 the harness reported the fixed loop too
(a query answering True was not a synchronization to the tracker), and `query()` answered True
while the copy still waited behind `torch.cuda._sleep`, where CUDA answers False."""

from __future__ import annotations

import pytest
import torch

from harness.emulation import emulation_active, track_stream_races
from harness.emulation.tracking import RaceError

TOKENS = [3, 7, 1, 12]


class AsyncOutput:
    """One decode step: logits on the main stream, the tokens copied to pinned memory on a copy
    stream, the host told by an event when it may read them."""

    def __init__(self) -> None:
        self.copy_stream = torch.cuda.Stream()
        self.logits = torch.eye(16, device="cuda")[torch.tensor(TOKENS, device="cuda")]
        self.tokens = torch.empty(len(TOKENS), dtype=torch.long, pin_memory=True)
        self.forward_done = torch.cuda.Event()
        self.copy_done = torch.cuda.Event()

    def step(self, *, stall: bool = False) -> None:
        sampled = self.logits.argmax(-1)
        self.forward_done.record()
        self.copy_stream.wait_event(self.forward_done)
        with torch.cuda.stream(self.copy_stream):
            if stall:
                torch.cuda._sleep(50_000_000)  # a busy copy engine: the copy lands late
            self.tokens.copy_(sampled, non_blocking=True)
            sampled.record_stream(self.copy_stream)
            self.copy_done.record()

    def read(self, *, poll_copy_event: bool) -> tuple[list[int], int]:
        """Poll until the event answers True, doing other host work meanwhile; the tokens and how
        many polls answered False."""
        event = self.copy_done if poll_copy_event else self.forward_done
        busy = 0
        while not event.query():
            busy += 1
        return self.tokens.tolist(), busy


def _needs_the_emulated_streams() -> None:
    # Over a real GPU, track_stream_races() sees CUDA tensors only, not the host's reads of pinned
    # memory (as for the other pinned-memory miniatures): the race would go unreported there.
    if emulation_active() != "cpu":
        pytest.skip("host accesses of pinned memory are tracked on the emulated device only")


@pytest.mark.strict_races
def test_polling_the_forward_event_and_reading_the_copy_is_a_race():
    _needs_the_emulated_streams()
    with pytest.raises(RaceError, match="test_polled_event_before_reading_tokens.py") as caught:
        with track_stream_races():
            output = AsyncOutput()
            output.step()
            output.read(poll_copy_event=False)
    text = str(caught.value)
    assert "host read before the device work" in text and "aten.copy_" in text


@pytest.mark.strict_races
def test_polling_the_copy_event_reads_the_tokens_clean():
    with track_stream_races():
        output = AsyncOutput()
        output.step()
        tokens, _ = output.read(poll_copy_event=True)
    assert tokens == TOKENS


@pytest.mark.strict_races
def test_a_copy_held_back_answers_false_until_it_ran():
    with track_stream_races():
        output = AsyncOutput()
        output.step(stall=True)
        tokens, busy = output.read(poll_copy_event=True)
    assert tokens == TOKENS
    assert busy >= 1  # CUDA's query answers False while the sleep holds the copy back
