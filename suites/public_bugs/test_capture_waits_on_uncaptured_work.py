"""A capturing stream made to wait on work outside its capture: a prefetch stream's "layer ready"
event recorded before the capture and waited on inside it, and a copy stream joined back into the
capture without having been forked from it (SGLang's HiSparse host backup and a MoE host-offload
prefetch both met it; TensorRT-LLM #12462's side-stream sends). CUDA refuses the wait with
cudaErrorStreamCaptureIsolation ("dependency created on uncaptured work in another stream") in
every capture mode and invalidates the capture; the emulated device names the call and the user's
line. On a GPU the file runs natively, against CUDA itself, and in the graph sanitizer, which
refuses the wait as CUDA does (no driver capture runs there for CUDA to refuse it).
Fixed: wait before the capture begins, or fork the other stream from the capturing stream inside
the capture before its work."""

from __future__ import annotations

import torch

import harness
from harness.emulation import emulation_active

from suites.public_bugs._refusals import stream_kept
from suites.cuda_device._own_process import in_a_process_of_its_own


# On a GPU, natively (CUDA's own verdict) or the session's graph sanitizer; on a CPU, the
# emulated device (conftest.py)
RUNS_NATIVELY_ON_A_GPU = True


class Prefetcher:
    def __init__(self) -> None:
        self.copy_stream = torch.cuda.Stream()
        self.ready = torch.cuda.Event()
        self.weights = torch.zeros(16, device="cuda")
        self.x = torch.ones(16, device="cuda")
        self.out = torch.zeros(16, device="cuda")
        self.graph = torch.cuda.CUDAGraph()

    def prefetch(self) -> None:
        self.copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.copy_stream):
            self.weights.fill_(3.0)
            self.ready.record()

    def layer(self) -> None:
        torch.mul(self.x, self.weights, out=self.out)

    def capture_waiting_inside(self) -> None:
        self.prefetch()
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph):
            torch.cuda.current_stream().wait_event(self.ready)
            self.layer()

    def capture_waiting_before(self) -> None:
        self.prefetch()
        torch.cuda.current_stream().wait_event(self.ready)
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph):
            self.layer()

    def capture_joining_unforked(self, *, fork: bool) -> None:
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph):
            if fork:
                self.copy_stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.copy_stream):
                torch.mul(self.x, 3.0, out=self.weights)
            torch.cuda.current_stream().wait_stream(self.copy_stream)
            self.layer()


ISOLATION = "dependency created on uncaptured work in another stream"


def _refusal(which: str) -> str:
    """What capturing the buggy form `which` ("event" or "join") raised, as text ("" if nothing)."""
    prefetcher = Prefetcher()
    try:
        with stream_kept():
            if which == "event":
                prefetcher.capture_waiting_inside()
            else:
                prefetcher.capture_joining_unforked(fork=False)
    except RuntimeError as error:  # CaptureError on the emulated device, CUDA's own natively
        # Natively the graph's exit ends the invalidated capture and raises that ("operation
        # failed due to a previous error during capture"), the wait's refusal as its context.
        chain = []
        while error is not None:
            chain.append(str(error))
            error = error.__context__
        return "\n".join(chain)
    return ""


def _refused(which: str) -> str:
    if emulation_active() is None:
        # Natively: a refused real capture leaves its process's CUDA state broken behind it.
        return in_a_process_of_its_own(__file__, "_refusal", which)
    return _refusal(which)


def test_waiting_inside_the_capture_on_an_event_recorded_before_it_is_refused():
    message = _refused("event")
    assert ISOLATION in message, message
    if emulation_active() == "cpu":  # the harness's detail: the call and the user's line
        assert "wait_event" in message and "test_capture_waits_on_uncaptured_work.py" in message


def test_joining_a_stream_never_forked_into_the_capture_is_refused():
    message = _refused("join")
    assert ISOLATION in message, message
    if emulation_active() == "cpu":
        assert "wait_stream" in message and "test_capture_waits_on_uncaptured_work.py" in message


def test_waiting_before_the_capture_replays():
    prefetcher = Prefetcher()
    prefetcher.capture_waiting_before()
    prefetcher.x.fill_(2.0)
    prefetcher.graph.replay()
    assert prefetcher.out.tolist() == [6.0] * 16


def test_a_stream_forked_inside_the_capture_joins_and_replays():
    prefetcher = Prefetcher()
    prefetcher.capture_joining_unforked(fork=True)
    prefetcher.x.fill_(2.0)
    prefetcher.graph.replay()
    assert prefetcher.out.tolist() == [12.0] * 16
