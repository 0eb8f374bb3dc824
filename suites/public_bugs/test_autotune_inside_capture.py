"""A kernel wrapper that autotunes on the first call of each shape, timing its candidates with
CUDA events (Triton's `do_bench` pattern, triton-lang/triton #10596; lazy first-use work inside a
capture, jax-ml/jax #37094). The warmup ran the decode batch of 4 only, so the capture of the batch
of 8 is the first call of its shape and times candidates inside the captured region. CUDA refuses
it: `torch.cuda.synchronize()` with "operation not permitted when stream is capturing", and
waiting on the end event (or `elapsed_time`, which queries both events) with "operation not
permitted on an event last recorded in a capturing stream"; the capture is invalidated. Fixed:
warm up every shape that will be captured first, so the capture meets a tuned cache. (An
`elapsed_time` read with no wait at all was captured on the emulated device until 2026-12-06:
`suites/cuda_device/test_capture_syncs.py` holds that case.)"""

from __future__ import annotations

import pytest
import torch

from harness.graphs import CaptureError

from suites.public_bugs._refusals import stream_kept

NOT_PERMITTED = "operation not permitted when stream is capturing"
CAPTURED_EVENT = "operation not permitted on an event last recorded in a capturing stream"


class TunedMatmul:
    """`x @ w`, computed in one of two layouts, the faster chosen per batch size on first use."""

    def __init__(self, *, wait: str) -> None:
        self.wait = wait  # how the tuner waits for its timings: "device" or "event"
        self.w = torch.randn(16, 16, device="cuda")
        self.best: dict[int, int] = {}

    def _candidates(self, x: torch.Tensor):
        return (lambda: x @ self.w, lambda: (self.w.t() @ x.t()).t())

    def _tune(self, x: torch.Tensor) -> int:
        times = []
        for run in self._candidates(x):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            if self.wait == "device":
                torch.cuda.synchronize()
            else:
                end.synchronize()
            times.append(start.elapsed_time(end))
        return min(range(len(times)), key=times.__getitem__)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        choice = self.best.get(x.shape[0])
        if choice is None:
            choice = self.best[x.shape[0]] = self._tune(x)
        return self._candidates(x)[choice]()


def _captured_decode(matmul: TunedMatmul, warmed: tuple[int, ...]) -> torch.Tensor:
    for batch in warmed:
        matmul(torch.randn(batch, 16, device="cuda"))
    x = torch.randn(8, 16, device="cuda")
    out = torch.zeros(8, 16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out.copy_(matmul(x))
    x.copy_(torch.ones(8, 16, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("wait, refusal", [("device", NOT_PERMITTED), ("event", CAPTURED_EVENT)])
def test_autotuning_a_shape_first_met_in_the_capture_is_refused(wait, refusal):
    with stream_kept(), pytest.raises((CaptureError, RuntimeError)) as caught:
        _captured_decode(TunedMatmul(wait=wait), warmed=(4,))
    assert refusal in str(caught.value), caught.value


@pytest.mark.parametrize("wait", ["device", "event"])
def test_warming_up_every_captured_shape_captures_the_tuned_kernel(wait):
    matmul = TunedMatmul(wait=wait)
    out = _captured_decode(matmul, warmed=(4, 8))
    expected = torch.ones(8, 16, device="cuda") @ matmul.w
    torch.testing.assert_close(out, expected)
