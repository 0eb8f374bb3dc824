"""Host synchronizations during a capture, refused as CUDA refuses them: on the emulated device, in
the graph sanitizer and natively on a GPU (the same cases, so the H200 run shows CUDA's verdicts).

A call that conflicts with the capture itself (the device, a capturing stream, an event recorded
in the capture) is refused in every capture_error_mode from every thread; any other sync or query
is refused in "global" mode from every thread, in "thread_local" mode from the capturing thread
only, never in "relaxed" mode. A refused call invalidates the capture: it fails at its end."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from suites.cuda_device._own_process import in_a_process_of_its_own


NOT_PERMITTED = "operation not permitted when stream is capturing"
CAPTURED_EVENT = "operation not permitted on an event last recorded in a capturing stream"
INVALIDATED = "operation failed due to a previous error during capture"


@dataclass(frozen=True)
class Targets:
    capturing: object  # the capturing stream
    side: object  # a stream outside the capture
    captured: object  # an event recorded inside the capture
    outside: object  # an event recorded before it


@dataclass(frozen=True)
class Case:
    name: str
    call: Callable[[Targets], object]
    conflicts: bool  # with the capture itself: refused in every mode


CASES = [
    Case("torch.cuda.synchronize()", lambda t: torch.cuda.synchronize(), True),
    Case("torch.cuda.synchronize(device=0)", lambda t: torch.cuda.synchronize(device=0), True),
    Case("capturing_stream.synchronize()", lambda t: t.capturing.synchronize(), True),
    Case("capturing_stream.query()", lambda t: t.capturing.query(), True),
    Case("captured_event.synchronize()", lambda t: t.captured.synchronize(), True),
    Case("captured_event.query()", lambda t: t.captured.query(), True),
    # Another Python object for the capturing stream (how a pooled stream made later, or an
    # external one, meets it): still the capturing stream, refused from every thread and mode.
    Case("capturing_stream_alias.synchronize()", lambda t: _alias(t.capturing).synchronize(), True),
    Case("side_stream.synchronize()", lambda t: t.side.synchronize(), False),
    Case("side_stream.query()", lambda t: t.side.query(), False),
    Case("outside_event.synchronize()", lambda t: t.outside.synchronize(), False),
    Case("outside_event.query()", lambda t: t.outside.query(), False),
    # torch's elapsed_time queries both events first (an autotuner timing candidates in capture).
    Case("captured_event.elapsed_time()", lambda t: _timed_on(t.capturing), True),
]


def _timed_on(stream) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    end.record(stream)
    return start.elapsed_time(end)


def _alias(stream) -> torch.cuda.Stream:
    return torch.cuda.Stream(stream_id=stream.stream_id, device_index=stream.device_index,
                             device_type=stream.device_type)


def _refused(case: Case, mode: str, own_thread: bool) -> bool:
    return case.conflicts or mode == "global" or (mode == "thread_local" and own_thread)


def _capture_with(call: Callable[[Targets], object], mode: str, in_thread: bool):
    """Capture `x += 1; call(); x += 1`, `call` made on this thread or on one started inside the
    capture; returns (the graph, x, the errors `call` raised, what ending the capture raised)."""
    # Capture on a stream of our own, made just before `side`: torch.cuda.Stream() hands out
    # CUDA's pooled streams round-robin (32 per priority), so `side` made any later could be the
    # very stream torch.cuda.graph's process-wide capture stream is, and a sync of it conflicts.
    capturing = torch.cuda.Stream()
    side = torch.cuda.Stream()
    if side == capturing:
        raise RuntimeError(f"two streams made in a row are one CUDA stream ({side}): the case "
                           f"would sync the capturing stream, not one outside the capture")
    x = torch.zeros(4, device="cuda")
    outside = torch.cuda.Event()
    outside.record(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    errors: list[BaseException] = []

    def attempt(targets: Targets) -> None:
        try:
            call(targets)
        except RuntimeError as error:
            errors.append(error)

    ended = None
    caller_stream = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph, stream=capturing, capture_error_mode=mode):
            x.add_(1)
            captured = torch.cuda.Event()
            captured.record()
            targets = Targets(torch.cuda.current_stream(), side, captured, outside)
            if in_thread:
                worker = threading.Thread(target=attempt, args=(targets,))
                worker.start()
                worker.join()
            else:
                attempt(targets)
            x.add_(1)
    except RuntimeError as error:
        ended = error
    finally:
        # torch.cuda.graph leaves its side stream current when capture_end raises (natively too).
        torch.cuda.set_stream(caller_stream)
    return graph, x, errors, ended


def _outcome(case_name: str, mode: str, in_thread: bool) -> tuple[list[str], str | None, list | None]:
    """The case's errors, what ending the capture raised, and x after one replay (when the
    capture ended well), as text: what a process of its own can send back."""
    case = next(c for c in CASES if c.name == case_name)
    graph, x, errors, ended = _capture_with(case.call, mode, in_thread)
    values = None
    if ended is None:
        graph.replay()
        torch.cuda.synchronize()
        values = x.tolist()
    return [str(e) for e in errors], None if ended is None else str(ended), values


def _outcome_on(cuda_kind: str, case: Case, mode: str, in_thread: bool):
    if cuda_kind == "native" and _refused(case, mode, own_thread=not in_thread):
        # A refusal invalidates a real capture and breaks the process's CUDA state behind it.
        return in_a_process_of_its_own(__file__, "_outcome", case.name, mode, in_thread)
    return _outcome(case.name, mode, in_thread)


def _check(cuda_kind: str, case: Case, mode: str, in_thread: bool) -> None:
    errors, ended, values = _outcome_on(cuda_kind, case, mode, in_thread)
    if _refused(case, mode, own_thread=not in_thread):
        expected = CAPTURED_EVENT if case.name.startswith("captured_event") else NOT_PERMITTED
        assert len(errors) == 1 and expected in errors[0], errors
        assert ended is not None and INVALIDATED in ended, ended
    else:
        assert errors == [] and ended is None, (errors, ended)
        assert values == [2.0] * 4  # the capture ran nothing; one replay adds 2

@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_host_sync_on_the_capturing_thread(cuda_kind, case, mode):
    _check(cuda_kind, case, mode, in_thread=False)


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_host_sync_from_another_thread(cuda_kind, case, mode):
    _check(cuda_kind, case, mode, in_thread=True)


def test_the_refusal_begins_with_cudas_text_and_names_the_line(cuda_kind):
    if cuda_kind == "native":
        errors, _, _ = in_a_process_of_its_own(__file__, "_outcome", "torch.cuda.synchronize()", "global", False)
        assert errors[0].startswith(f"CUDA error: {NOT_PERMITTED}")
        return
    _, _, errors, _ = _capture_with(lambda t: torch.cuda.synchronize(), "global", False)
    assert str(errors[0]).startswith(f"CUDA error: {NOT_PERMITTED}")
    assert "torch.cuda.synchronize()" in str(errors[0])
    assert "_capture_with(lambda t: torch.cuda.synchronize()" in str(errors[0])  # the line


def test_a_background_thread_syncing_its_stream_during_a_global_capture(cuda_kind):
    """The vLLM bug: a thread started before the capture synchronizes its own stream while the
    main thread captures in the default mode; CUDA refuses it and the capture fails."""
    if cuda_kind == "native":
        errors, ended = in_a_process_of_its_own(__file__, "_background_thread_syncs")
    else:
        errors, ended = _background_thread_syncs()
    assert ended is not None and INVALIDATED in ended, ended
    assert len(errors) == 1 and NOT_PERMITTED in errors[0], errors


def _background_thread_syncs() -> tuple[list[str], str | None]:
    """The background thread's errors and what ending the capture raised, as text."""
    capturing, synced = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    own = torch.cuda.Stream()

    def background() -> None:
        capturing.wait()
        try:
            own.synchronize()
        except RuntimeError as error:
            errors.append(error)
        synced.set()

    worker = threading.Thread(target=background)
    worker.start()
    x = torch.zeros(4, device="cuda")
    graph = torch.cuda.CUDAGraph()
    caller_stream = torch.cuda.current_stream()
    ended = None
    try:
        with torch.cuda.graph(graph):
            x.add_(1)
            capturing.set()
            synced.wait()
            x.add_(1)
    except RuntimeError as error:
        ended = str(error)
    finally:
        capturing.set()  # never leave the worker waiting
        worker.join()
        torch.cuda.set_stream(caller_stream)
    torch.cuda.synchronize()  # after the capture: allowed again
    return [str(e) for e in errors], ended


def _process_id() -> int:
    import os

    return os.getpid()


def test_a_process_of_its_own_is_a_new_process_that_returns_the_result():
    import os

    assert in_a_process_of_its_own(__file__, "_process_id") != os.getpid()
    with pytest.raises(StopIteration):  # the case name is unknown: the child's error comes back
        in_a_process_of_its_own(__file__, "_outcome", "no such case", "global", False)


# Host reads of device data on the capturing thread: each copies to the host, then waits for the
# capturing stream (cudaStreamSynchronize in memcpy_and_sync), which CUDA refuses; a refused call
# invalidates the capture even when the caller caught its error. `tolist` is refused earlier, by
# Copy.cu's pageable-copy check, before any CUDA call, so its capture stays valid.
HOST_READS = {
    "x.item()": (lambda x: x.sum().item(), NOT_PERMITTED, True),
    "bool(x)": (lambda x: bool(x[0] > 0), NOT_PERMITTED, True),
    "print(x)": (lambda x: print(x), NOT_PERMITTED, True),
    "x.tolist()": (lambda x: x.tolist(),
                   "Cannot copy between CPU and CUDA tensors during CUDA graph capture", False),
}


def _host_read_outcome(name: str, mode: str) -> tuple[list[str], str | None]:
    read = HOST_READS[name][0]
    x = torch.ones(4, device="cuda")
    _, _, errors, ended = _capture_with(lambda t: read(x), mode, False)
    return [str(e) for e in errors], None if ended is None else str(ended)


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
@pytest.mark.parametrize("name", HOST_READS)
def test_a_host_read_of_device_data_on_the_capturing_thread(request, cuda_kind, name, mode):
    if cuda_kind == "sanitizer":
        # Open (docs/fidelity.md): on the H200, run among this file's other cases with xdist's
        # default distribution or alone in one process, 3 or 4 of the 12 sanitizer cases raised
        # nothing; with --dist loadfile, and run outside pytest one after another or each in a
        # process of its own, all 12 gave CUDA's verdicts (2026-12-03).
        request.applymarker(pytest.mark.xfail(
            strict=False, reason="sanitizer: order-dependent, open (docs/fidelity.md)"))
    _, expected, invalidates = HOST_READS[name]
    if cuda_kind == "native":
        errors, ended = in_a_process_of_its_own(__file__, "_host_read_outcome", name, mode)
    else:
        errors, ended = _host_read_outcome(name, mode)
    assert len(errors) == 1 and expected in errors[0], errors
    if invalidates:
        assert ended is not None and INVALIDATED in ended, ended
    else:
        assert ended is None, ended


def test_a_refusal_in_every_mode_suggests_no_capture_mode(cuda_device):
    """Another thread's torch.cuda.synchronize() waits for the capture itself, so "thread_local"
    refuses it too: the message must not offer that mode as the remedy."""
    _, _, errors, _ = _capture_with(lambda t: torch.cuda.synchronize(), "thread_local", True)
    assert len(errors) == 1 and NOT_PERMITTED in str(errors[0])
    assert "capture_error_mode='thread_local'" not in str(errors[0])
