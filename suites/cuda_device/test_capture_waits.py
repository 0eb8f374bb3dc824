"""A capturing stream's waits, judged as CUDA judges them: on the emulated device and natively on
a GPU (the same cases, so the H200 run shows CUDA's verdicts) and in the graph sanitizer (which
judges them itself: no driver capture runs there). Waiting on work outside the capture (an event recorded before it, a
stream never forked into it) is cudaErrorStreamCaptureIsolation in every capture mode and
invalidates the capture; waiting on an event never recorded, on one recorded inside the capture,
or on a stream forked into it is allowed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from suites.cuda_device._own_process import in_a_process_of_its_own

ISOLATION = "dependency created on uncaptured work in another stream"
INVALIDATED = "operation failed due to a previous error during capture"


@dataclass(frozen=True)
class Targets:
    side: object  # a stream outside the capture, with work of its own
    outside: object  # an event recorded on it before the capture
    never: object  # an event never recorded


@dataclass(frozen=True)
class Case:
    name: str
    call: Callable[[Targets], object]
    refused: bool


def _fork_and_join(t: Targets) -> None:
    t.side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(t.side):
        torch.cuda.current_stream()  # the forked stream's work would go here
    torch.cuda.current_stream().wait_stream(t.side)


def _recorded_inside(t: Targets) -> None:
    inside = torch.cuda.Event()
    inside.record()
    torch.cuda.current_stream().wait_event(inside)


CASES = [
    Case("wait_event(event recorded before the capture)",
         lambda t: torch.cuda.current_stream().wait_event(t.outside), True),
    Case("wait_stream(stream never forked)",
         lambda t: torch.cuda.current_stream().wait_stream(t.side), True),
    Case("wait_event(event never recorded)",
         lambda t: torch.cuda.current_stream().wait_event(t.never), False),
    Case("wait_event(event recorded inside)", _recorded_inside, False),
    Case("fork, then join", _fork_and_join, False),
]


def _outcome(case_name: str, mode: str) -> tuple[list[str], str | None, list | None]:
    """The case's errors, what ending the capture raised, and x after one replay, as text."""
    case = next(c for c in CASES if c.name == case_name)
    capturing, side = torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.zeros(4, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    outside = torch.cuda.Event()
    with torch.cuda.stream(side):
        torch.zeros(4, device="cuda")
        outside.record()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    errors: list[str] = []
    ended = None
    caller_stream = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph, stream=capturing, capture_error_mode=mode):
            x.add_(1)
            try:
                case.call(Targets(side, outside, torch.cuda.Event()))
            except RuntimeError as error:
                errors.append(str(error))
            x.add_(1)
    except RuntimeError as error:
        ended = str(error)
    finally:
        torch.cuda.set_stream(caller_stream)
    values = None
    if ended is None:
        graph.replay()
        torch.cuda.synchronize()
        values = x.tolist()
    return errors, ended, values


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_capturing_streams_wait(cuda_kind, case, mode):
    if cuda_kind == "native" and case.refused:
        errors, ended, values = in_a_process_of_its_own(__file__, "_outcome", case.name, mode)
    else:
        errors, ended, values = _outcome(case.name, mode)
    if case.refused:
        assert len(errors) == 1 and ISOLATION in errors[0], errors
        assert ended is not None and INVALIDATED in ended, ended
    else:
        assert errors == [] and ended is None, (errors, ended)
        assert values == [2.0] * 4


def test_the_refusal_begins_with_cudas_text_and_names_the_call_and_line(cuda_kind):
    if cuda_kind != "emulated":
        pytest.skip("the harness's detail is the emulated device's")
    errors, _, _ = _outcome("wait_event(event recorded before the capture)", "global")
    assert errors[0].startswith(f"CUDA error: {ISOLATION} (cudaErrorStreamCaptureIsolation)")
    assert "Stream.wait_event()" in errors[0]
    assert "wait_event(t.outside)" in errors[0]  # the line
