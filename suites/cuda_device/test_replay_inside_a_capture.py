"""Replaying a graph while the current stream is capturing another: torch refuses it before any
CUDA call ("Cannot prepare for replay during capturing stage", in every capture_error_mode), so
the capture goes on and ends without the inner graph's work (H100, torch 2.11). The realistic way
to meet it is a layer made by `torch.cuda.make_graphed_callables` (Megatron / TransformerEngine's
per-layer graphs) called inside a later whole-step capture: its forward is a replay. The emulated
device ran such a replay at once, during the capture, and left it out of the outer graph. Native
rows run in a process of their own, as a capture that fails would break CUDA's process state."""

from __future__ import annotations

import pytest
import torch

from suites.cuda_device._own_process import in_a_process_of_its_own

REFUSED = "Cannot prepare for replay during capturing stage"


def _replay_inside(mode: str) -> tuple[str | None, str | None, list[float]]:
    """What replaying a captured graph inside another capture raised, what ending that capture
    raised, as text, and x after a replay of the outer graph."""
    x = torch.ones(4, device="cuda")
    inner = torch.cuda.CUDAGraph()
    with torch.cuda.graph(inner):
        x.mul_(2)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    outer = torch.cuda.CUDAGraph()
    refused = ended = None
    with torch.cuda.stream(stream):
        outer.capture_begin(capture_error_mode=mode)
        try:
            inner.replay()
        except RuntimeError as error:
            refused = str(error)
        x.add_(1)
        try:
            outer.capture_end()
        except RuntimeError as error:
            ended = str(error)
    if ended is not None:
        return refused, ended, []
    x.fill_(5.0)
    outer.replay()
    return refused, ended, x.tolist()


def _graphed_layer_inside_a_capture() -> str | None:
    """What calling a graphed callable inside a whole-step capture raised, as text."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 8).cuda()
    sample = torch.randn(4, 8, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(layer, (sample,))
    x = torch.randn(4, 8, device="cuda", requires_grad=True)
    step = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(step):
            graphed(x).sum().backward()
    except RuntimeError as error:
        return str(error)
    return None


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_a_replay_into_a_capturing_stream_is_refused_and_the_capture_goes_on(cuda_kind, mode):
    if cuda_kind == "native":
        refused, ended, after = in_a_process_of_its_own(__file__, "_replay_inside", mode)
    else:
        refused, ended, after = _replay_inside(mode)
    assert refused is not None and REFUSED in refused, refused
    assert ended is None
    assert after == [6.0] * 4  # the outer graph's own add, not the inner graph's doubling


def test_a_graphed_callable_called_inside_a_capture_is_refused(cuda_kind):
    if cuda_kind == "native":
        error = in_a_process_of_its_own(__file__, "_graphed_layer_inside_a_capture")
    else:
        error = _graphed_layer_inside_a_capture()
    assert error is not None and REFUSED in error, error


def test_a_replay_outside_the_capture_still_runs(cuda_kind):
    x = torch.ones(4, device="cuda")
    inner = torch.cuda.CUDAGraph()
    with torch.cuda.graph(inner):
        y = x * 2
    x.fill_(3.0)
    inner.replay()
    assert y.tolist() == [6.0] * 4
