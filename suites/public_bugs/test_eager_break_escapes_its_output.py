"""A piecewise step whose eager break between two captured pieces hands its result to the next
piece through `self` instead of returning it (the escaped allocation vLLM's breakable-cudagraph
debug mode hunts, ROCm ATOM #2126: https://github.com/ROCm/ATOM/pull/2126), or from a side stream
(TensorRT-LLM #13354, eager multi-stream pieces returning fresh addresses to the next captured
piece, "ADDRESS MISMATCH": https://github.com/NVIDIA/TensorRT-LLM/pull/13354). The break allocates
its result anew at every step; the second piece's graph keeps the address of the tensor the break
made during the capture pass. Rebinding `self.attn` drops that tensor: the replay would read freed
memory (on CUDA whatever the allocator put there next: the break's newest result on the steps its
allocation happens to take that block, stale or foreign values on the others), and the harness
refuses it, naming the capture's line and the rebinding. Kept alive (a list of past results, a
debug hook), the old tensor gives the capture pass's values at every replay, on CUDA as on the
emulated device: the output differs from eager. Fixed: the break returns its result and the
runtime copies it into the piece's static input, after the main stream waits for the side stream,
which `record_stream` tells of the main stream's use."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import FreedMemoryError

STEPS = 3


class PiecewiseStep:
    def __init__(self, *, copy_into_static: bool, side_stream: bool,
                 keep_old: bool = False) -> None:
        self.copy_into_static = copy_into_static
        self.side = torch.cuda.Stream() if side_stream else None
        self.keep_old = keep_old
        self.history: list[torch.Tensor] = []
        self.x = torch.zeros(8, device="cuda")
        self.hidden = torch.zeros(8, device="cuda")
        self.attn_in = torch.zeros(8, device="cuda")  # the second piece's static input
        self.attn: torch.Tensor | None = None
        self.out = torch.zeros(8, device="cuda")

    def first_piece(self) -> None:
        self.hidden.copy_(self.x * 2)

    def attention(self) -> torch.Tensor:
        """The break: run eagerly between the graphs (a shape the host decides)."""
        if self.side is None:
            return self.hidden + 1
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            result = self.hidden + 1
        torch.cuda.current_stream().wait_stream(self.side)
        result.record_stream(torch.cuda.current_stream())
        return result

    def eager_break(self) -> None:
        result = self.attention()
        if self.copy_into_static:
            self.attn_in.copy_(result)
            return
        if self.keep_old and self.attn is not None:
            self.history.append(self.attn)
        self.attn = result  # escapes: the next piece reads whatever self.attn was at capture

    def second_piece(self) -> None:
        source = self.attn_in if self.copy_into_static else self.attn
        self.out.copy_(source * 10)

    def capture(self) -> tuple[torch.cuda.CUDAGraph, torch.cuda.CUDAGraph]:
        torch.cuda.synchronize()
        first, second = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        self.x.fill_(100.0)  # the capture pass's dummy batch
        with torch.cuda.graph(first):
            self.first_piece()
        first.replay()  # the capture ran nothing: fill the break's input as the pass would
        self.eager_break()
        with torch.cuda.graph(second, pool=first.pool()):
            self.second_piece()
        return first, second

    def graphed(self) -> list[list[float]]:
        first, second = self.capture()
        outs = []
        for step in range(STEPS):
            self.x.fill_(float(step))
            first.replay()
            self.eager_break()
            second.replay()
            outs.append(self.out.tolist())
        return outs


EAGER = [[(2.0 * step + 1) * 10] * 8 for step in range(STEPS)]
CAPTURE_PASS = [(2.0 * 100 + 1) * 10] * 8


@pytest.mark.parametrize("side_stream", [False, True], ids=["one_stream", "side_stream"])
def test_a_break_result_stored_on_self_is_freed_memory_to_the_next_piece(side_stream):
    step = PiecewiseStep(copy_into_static=False, side_stream=side_stream)
    with pytest.raises(FreedMemoryError, match=r"freed after capture") as caught:
        step.graphed()
    message = str(caught.value)
    assert "self.out.copy_(source * 10)" in message  # the second piece's read, captured
    assert "self.attn = result" in message  # the rebinding that dropped it


@pytest.mark.parametrize("side_stream", [False, True], ids=["one_stream", "side_stream"])
def test_a_break_result_kept_alive_replays_the_capture_pass_values(side_stream):
    outs = PiecewiseStep(copy_into_static=False, side_stream=side_stream, keep_old=True).graphed()
    assert outs == [CAPTURE_PASS] * STEPS
    assert outs != EAGER


@pytest.mark.parametrize("side_stream", [False, True], ids=["one_stream", "side_stream"])
def test_a_returned_result_copied_into_the_static_input_replays_as_eager(side_stream):
    assert PiecewiseStep(copy_into_static=True, side_stream=side_stream).graphed() == EAGER
