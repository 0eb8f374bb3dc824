"""A copy to the host of device data on a stream outside the capture under way (another thread's
own stream, or a side stream of the capturing thread): Copy.cu's pageable-copy check asks only the
calling thread's current stream, so it passes; the copy then waits for its stream
(memcpy_and_sync), a potentially unsafe call: refused in "global" mode from every thread, in
"thread_local" mode from the capturing thread, never in "relaxed" mode, and a refusal invalidates
the capture. The emulated device let `.item()` through in every case and refused `.cpu()`, `.tolist()` and
printing with Copy.cu's text (or a sync refusal) in every case. The graph sanitizer applies the
same rule since 2026-12-06 (sanitizer_threads.py). Native rows of refused cases run in
a process of their own (a failed real capture leaves CUDA's process state broken)."""

from __future__ import annotations

import threading

import pytest
import torch

from suites.cuda_device._own_process import in_a_process_of_its_own

NOT_PERMITTED = "operation not permitted when stream is capturing"
INVALIDATED = "operation failed due to a previous error during capture"
READS = {"item": lambda t: t.sum().item(), "cpu": lambda t: t.cpu().sum().item(),
         "tolist": lambda t: float(sum(t.tolist())),
         "repr": lambda t: 12.0 if "3." in repr(t) else None}


def _read_during_capture(mode: str, read: str, in_thread: bool) -> tuple[str, str | None]:
    """(what the read gave or raised, what ending the capture raised), as text."""
    data = torch.full((4,), 3.0, device="cuda")
    x = torch.zeros(4, device="cuda")
    capturing, side = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    outcome: list[str] = []

    def attempt() -> None:
        try:
            with torch.cuda.stream(side):
                outcome.append(repr(READS[read](data)))
        except RuntimeError as error:
            outcome.append(str(error))

    graph = torch.cuda.CUDAGraph()
    caller = torch.cuda.current_stream()
    ended = None
    try:
        with torch.cuda.graph(graph, stream=capturing, capture_error_mode=mode):
            x.add_(1)
            if in_thread:
                worker = threading.Thread(target=attempt)
                worker.start()
                worker.join()
            else:
                attempt()
            x.add_(1)
    except RuntimeError as error:
        ended = str(error)
    finally:
        torch.cuda.set_stream(caller)
    return outcome[0], ended


def _refused(mode: str, in_thread: bool) -> bool:
    return mode == "global" or (mode == "thread_local" and not in_thread)


@pytest.mark.parametrize("in_thread", [True, False], ids=["another thread", "capturing thread"])
@pytest.mark.parametrize("read", sorted(READS))
@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_a_host_read_on_a_stream_outside_the_capture(cuda_kind, mode, read, in_thread):
    refused = _refused(mode, in_thread)
    if cuda_kind == "native" and refused:
        got, ended = in_a_process_of_its_own(__file__, "_read_during_capture", mode, read, in_thread)
    else:
        got, ended = _read_during_capture(mode, read, in_thread)
    if refused:
        assert NOT_PERMITTED in got, got
        assert ended is not None and INVALIDATED in ended, ended
    else:
        assert got == "12.0" and ended is None, (got, ended)
