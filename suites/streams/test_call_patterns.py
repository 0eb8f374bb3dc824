"""Torch calls tracked through a learned call pattern (no aten op dispatched to the stream mode)
give the races, reports and lines that dispatching them gives.

A dispatch mode of the caller's own on the stack turns the patterns off (every aten op must reach
it), so each program runs twice, with and without one, and the reports must be the same text:
op names, sequence-ordered previous accesses, tensor labels and source lines."""

from __future__ import annotations

import pytest
import torch

import harness
from harness.emulation.tracking import RaceError
from fixtures.emulated_device import skip_unless_the_emulated_device_can_be_entered

from suites.streams._pass_through_mode import PassThrough

pytestmark = [pytest.mark.filterwarnings("ignore::harness.emulation.tracking.RaceWarning")]


def _racy_program() -> None:
    """Races of each kind an eager step can make, after every call was seen once (learned)."""
    side = torch.cuda.Stream()
    x = torch.ones(4, 8, device="cuda")
    w = torch.randn(8, 8, device="cuda")
    for _ in range(3):  # the first round learns each call's pattern, the later ones use it
        h = torch.matmul(x, w)  # the writer a side-stream reader races with
        y = (h * 2).float().reshape(32)
        with torch.cuda.stream(side):
            z = y + 1  # reads y before the default stream's write was waited for
            v = y[:8].view(2, 4) * 3
        torch.cuda.current_stream().wait_stream(side)
        u = torch.nn.functional.silu(z) + v.reshape(8).sum()
        with torch.cuda.stream(side):
            u2 = u * 0.5  # reads u before waiting for the default stream
        x.add_(u2.reshape(4, 8))  # in place: learned too
        torch.cuda.synchronize()


def _reports(patterns_on: bool) -> tuple[list[str], int]:
    with harness.emulate_cuda(device="cpu", races="report") as state:
        if patterns_on:
            _racy_program()
        else:
            with PassThrough():
                _racy_program()
        tracking = state.streams_tracking
        return [str(r) for r in tracking.reports], tracking.patterned_calls


def test_learned_calls_report_what_dispatched_calls_report():
    skip_unless_the_emulated_device_can_be_entered()
    dispatched, none = _reports(patterns_on=False)
    learned, used = _reports(patterns_on=True)
    assert none == 0
    assert used > 0, "no call went through a learned pattern"
    assert dispatched, "the program's races were not found"
    assert learned == dispatched


def test_race_on_a_learned_writer_names_its_op_and_line():
    skip_unless_the_emulated_device_can_be_entered()
    with harness.emulate_cuda(device="cpu", races="strict") as state:
        side = torch.cuda.Stream()
        x = torch.ones(4, 4, device="cuda")
        for _ in range(2):
            y = x * 2  # the second call is tracked through the pattern the first one left
        used = state.streams_tracking.patterned_calls
        with torch.cuda.stream(side), pytest.raises(RaceError) as raised:
            y - 1
        torch.cuda.synchronize()
    assert used >= 1
    text = str(raised.value)
    assert "aten.mul.Tensor writes it on stream 0 at" in text
    assert "y = x * 2" in text
    assert "tensor (shape (4, 4), torch.float32)" in text
    assert "aten.sub.Tensor reads it on stream" in text


def test_race_on_a_learned_in_place_write_names_its_op_and_line():
    skip_unless_the_emulated_device_can_be_entered()
    with harness.emulate_cuda(device="cpu", races="strict") as state:
        side = torch.cuda.Stream()
        x = torch.ones(4, 4, device="cuda")
        values = torch.zeros(2, 4, device="cuda")
        rows = torch.arange(2, device="cuda")
        used = []
        for _ in range(2):
            used.append(state.streams_tracking.patterned_calls)
            x.index_put_((rows,), values)  # the second call goes through the first one's pattern
        used.append(state.streams_tracking.patterned_calls)
        with torch.cuda.stream(side), pytest.raises(RaceError) as raised:
            x - 1
        torch.cuda.synchronize()
    assert used[2] - used[1] > used[1] - used[0], "the second index_put_ was not learned"
    text = str(raised.value)
    assert "aten.index_put_.default writes it on stream 0 at" in text
    assert "x.index_put_((rows,), values)" in text
    assert "tensor (shape (4, 4), torch.float32)" in text
    assert "aten.sub.Tensor reads it on stream" in text


def test_learned_in_place_write_on_a_stream_that_did_not_wait_still_races():
    skip_unless_the_emulated_device_can_be_entered()
    with harness.emulate_cuda(device="cpu", races="strict") as state:
        side = torch.cuda.Stream()
        x = torch.ones(4, 4, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.add_(1)  # learned here, ordered
            before = state.streams_tracking.patterned_calls
            x.add_(1)  # through the pattern, ordered
            learned = state.streams_tracking.patterned_calls == before + 1
        torch.cuda.current_stream().wait_stream(side)
        x * 2  # a default-stream read the side stream did not wait for
        with torch.cuda.stream(side), pytest.raises(RaceError, match="aten.add_.Tensor writes it"):
            x.add_(1)  # the same signature: through the pattern, and unordered now
        torch.cuda.synchronize()
    assert learned, "the second add_ did not go through a pattern"


def test_learned_reader_on_a_stream_that_did_not_wait_still_races():
    skip_unless_the_emulated_device_can_be_entered()
    with harness.emulate_cuda(device="cpu", races="strict"):
        side = torch.cuda.Stream()
        x = torch.ones(4, 4, device="cuda")
        y = x * 2
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y + 1  # learned here, ordered
        torch.cuda.current_stream().wait_stream(side)
        y.mul_(3)  # a new default-stream write
        with torch.cuda.stream(side), pytest.raises(RaceError, match="aten.add.Tensor reads it"):
            y + 1  # the same signature: through the pattern, and unordered now
        torch.cuda.synchronize()


_EXTRA: list = []


def _scale_by_global(x):
    """A user's function that torch function modes see whole (as torch's Python functions are),
    whose aten ops depend on state outside its arguments."""
    if torch.overrides.has_torch_function((x,)):
        return torch.overrides.handle_torch_function(_scale_by_global, (x,), x)
    out = x * 2
    for t in _EXTRA:
        out = out + t
    return out


def test_a_users_function_is_never_learned():
    skip_unless_the_emulated_device_can_be_entered()
    with harness.emulate_cuda(device="cpu", races="strict"):
        side = torch.cuda.Stream()
        x = torch.ones(4, device="cuda")
        _scale_by_global(x)  # one op reading x only, the first time
        bias = torch.ones(4, device="cuda") * 5
        _EXTRA.append(bias)
        try:
            side.wait_stream(torch.cuda.current_stream())
            bias.mul_(2)  # a later default-stream write the side stream did not wait for
            with torch.cuda.stream(side), pytest.raises(RaceError, match="aten.add.Tensor reads"):
                _scale_by_global(x)  # now reads bias too, which the same signature hides
        finally:
            _EXTRA.clear()
        torch.cuda.synchronize()



class _SeenCalls(torch.overrides.TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("races", ["strict", "off"])
def test_a_replay_makes_no_torch_calls_a_users_mode_sees(races):
    """CUDA's replay is one launch, no torch call. With tracking on, the launch's checks read the
    captured tensors' data pointers through the torch function modes, so a user's mode saw them
    and the placement mode took each for a device call (a tracked replay cost 1.4x an untracked
    one in `harness bench emulator`)."""
    skip_unless_the_emulated_device_can_be_entered()
    with harness.emulate_cuda(device="cpu", races=races):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())  # tracking is on from a second stream
        x = torch.ones(4, 4, device="cuda")
        y = x * 2 + 1
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = x * 2 + 1
        x.fill_(3)
        with _SeenCalls() as seen:
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y.cpu(), torch.full((4, 4), 7.0))
    assert seen.calls == []
