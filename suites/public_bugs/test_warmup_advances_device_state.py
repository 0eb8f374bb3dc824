"""Warmup runs that advance the live batch's device state (TensorRT-LLM #11696, "Preventing drift
accumulation on kv_lens_cuda": https://github.com/NVIDIA/TensorRT-LLM/pull/11696; #7373, the
speculative-decoding preprocessing that mutated `kv_lens` on every warmup, fixed by a
`postprocess_fn`: https://github.com/NVIDIA/TensorRT-LLM/pull/7373). The decode step appends its
token by advancing `kv_lens` in place on the device and reads the KV entry at the new length.
The runtime warms up twice and captures on the batch's own metadata: each warmup runs the step and
advances `kv_lens`, and the capture records the step without running it (CUDA runs no kernel while
capturing). Every replay then reads two positions past the right one: the step's output differs
from the eager run's, silently on CUDA as on the emulated device, and with enough drift the read
leaves the cache ("CUDA error: device-side assert triggered" at the replay). The same with
`torch.cuda.make_graphed_callables`, whose own warmup runs the module `num_warmup_iters` (3) times
on its buffers before the capture. Fixed: the runtime saves the state the step mutates before
warming up and restores it after the capture."""

from __future__ import annotations

import pytest
import torch

from harness.graphs.emulator.device_asserts import DeviceAssertError
from harness.emulation import emulation_active

CACHE = 16
WARMUPS = 2
STEPS = 3


class SpecDecodeStep:
    """Two requests whose KV entry at position p holds 100 * request + p."""

    def __init__(self, *, restore_after_capture: bool, lengths=(4, 7)) -> None:
        self.restore = restore_after_capture
        rows = torch.arange(2, device="cuda").unsqueeze(1) * 100
        self.kv = (rows + torch.arange(CACHE, device="cuda")).float()
        self.kv_lens = torch.tensor(lengths, device="cuda")
        self.rows = torch.arange(2, device="cuda")
        self.out = torch.zeros(2, device="cuda")

    def step(self) -> None:
        self.kv_lens.add_(1)  # the step's token appended (in place: the graph advances it too)
        self.out.copy_(self.kv[self.rows, self.kv_lens - 1])

    def capture(self) -> torch.cuda.CUDAGraph:
        saved = self.kv_lens.clone() if self.restore else None
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUPS):
                self.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.step()
        if saved is not None:
            self.kv_lens.copy_(saved)  # TensorRT-LLM's postprocess_fn
        return graph

    def graphed(self) -> list[list[float]]:
        graph = self.capture()
        outs = []
        for _ in range(STEPS):
            graph.replay()
            outs.append(self.out.tolist())
        return outs

    def eager(self) -> list[list[float]]:
        outs = []
        for _ in range(STEPS):
            self.step()
            outs.append(self.out.tolist())
        return outs


EAGER = [[4.0, 107.0], [5.0, 108.0], [6.0, 109.0]]


def test_the_capture_runs_no_step_and_each_warmup_runs_one():
    runtime = SpecDecodeStep(restore_after_capture=False)
    runtime.capture()
    assert runtime.kv_lens.tolist() == [4 + WARMUPS, 7 + WARMUPS]  # not + WARMUPS + 1


def test_replays_after_unrestored_warmups_read_past_the_appended_token():
    assert SpecDecodeStep(restore_after_capture=False).eager() == EAGER
    graphed = SpecDecodeStep(restore_after_capture=False).graphed()
    assert graphed == [[a + WARMUPS, b + WARMUPS] for a, b in EAGER]


def test_drift_past_the_cache_end_fails_the_replay_as_a_device_assert():
    if emulation_active() != "cpu":
        pytest.skip("on a GPU a device-side assert leaves the process's CUDA context unusable for "
                    "the rest of the session; the emulated device checks it")
    eager = SpecDecodeStep(restore_after_capture=False, lengths=(4, CACHE - WARMUPS))
    eager.step()
    assert eager.out.tolist() == [4.0, 100.0 + CACHE - WARMUPS]  # eager's step stays inside
    runtime = SpecDecodeStep(restore_after_capture=False, lengths=(4, CACHE - WARMUPS))
    graph = runtime.capture()
    with pytest.raises(DeviceAssertError, match="device-side assert triggered"):
        graph.replay()
        torch.cuda.synchronize()


def test_state_restored_after_the_capture_replays_as_eager():
    assert SpecDecodeStep(restore_after_capture=True).graphed() == EAGER


class AppendStep(torch.nn.Module):
    """The step as a module with its metadata in buffers, graphed by make_graphed_callables."""

    def __init__(self) -> None:
        super().__init__()
        rows = torch.arange(2, device="cuda").unsqueeze(1) * 100
        self.register_buffer("kv", (rows + torch.arange(CACHE, device="cuda")).float())
        self.register_buffer("kv_lens", torch.tensor([4, 7], device="cuda"))
        self.register_buffer("rows", torch.arange(2, device="cuda"))

    def forward(self, scale: torch.Tensor) -> torch.Tensor:
        self.kv_lens.add_(1)
        return self.kv[self.rows, self.kv_lens - 1] * scale


def _graphed_module(*, restore: bool) -> tuple[AppendStep, object]:
    module = AppendStep()
    saved = module.kv_lens.clone()
    graphed = torch.cuda.make_graphed_callables(module, (torch.ones(2, device="cuda"),))
    if restore:
        module.kv_lens.copy_(saved)
    return module, graphed


def test_make_graphed_callables_warmups_advance_the_module_state():
    module, graphed = _graphed_module(restore=False)
    assert module.kv_lens.tolist() == [4 + 3, 7 + 3]  # three warmup calls, a capture that ran none
    outs = [graphed(torch.ones(2, device="cuda")).tolist() for _ in range(STEPS)]
    assert outs == [[a + 3, b + 3] for a, b in EAGER]


def test_make_graphed_callables_with_the_state_restored_replays_as_eager():
    _, graphed = _graphed_module(restore=True)
    assert [graphed(torch.ones(2, device="cuda")).tolist() for _ in range(STEPS)] == EAGER
