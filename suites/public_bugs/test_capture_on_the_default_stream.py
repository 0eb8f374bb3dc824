"""A runner that captures on the stream current at the call, on a path where that is the default
stream (vLLM #42999, fixed by #43160: "CUDA graphs must be captured on a non-default stream." in
the LoRA capture path, which passed `stream=torch.cuda.current_stream()` before any capture stream
was made current; lightning-thunder #2692 generated on a non-default stream "so CUDAGraph is
willing to capture"). CUDA refuses the capture before it begins, in PyTorch's words; the emulated
device gives the same refusal, and leaves no capture behind. Fixed: the runner owns a capture
stream (what `torch.cuda.graph` makes when no `stream=` is given)."""

from __future__ import annotations

import pytest
import torch

# The refusal comes before any capture begins: CUDA's own verdict runs on a GPU too.
RUNS_NATIVELY_ON_A_GPU = True

REFUSAL = ("CUDA graphs must be captured on a non-default stream. (However, after capture, it's ok "
           "to replay them on the default stream.)")


class LoraGraphRunner:
    def __init__(self, *, own_stream: bool) -> None:
        self.weight = torch.linspace(0.5, 1.5, 8, device="cuda")
        self.lora_b = torch.zeros(8, device="cuda")
        self.static_input = torch.zeros(8, device="cuda")
        self.own_stream = torch.cuda.Stream() if own_stream else None
        self.graph = torch.cuda.CUDAGraph()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight + self.lora_b

    def capture(self) -> None:
        stream = self.own_stream or torch.cuda.current_stream()  # the bug: the caller's stream
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph, stream=stream):
            self.static_output = self.forward(self.static_input)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.static_input.copy_(x)
        self.graph.replay()
        return self.static_output.clone()


def test_capturing_on_the_callers_default_stream_is_refused_in_cudas_words():
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    runner = LoraGraphRunner(own_stream=False)
    with pytest.raises(RuntimeError) as refused:
        runner.capture()
    assert str(refused.value).startswith(REFUSAL), refused.value
    assert not torch.cuda.is_current_stream_capturing()
    torch.cuda.synchronize()  # nothing was left capturing


def test_a_capture_stream_of_its_own_captures_and_replays():
    runner = LoraGraphRunner(own_stream=True)
    runner.capture()
    runner.lora_b.fill_(1.0)  # an adapter loaded after capture, copied into the captured buffer
    x = torch.arange(8, dtype=torch.float32, device="cuda")
    assert torch.equal(runner(x), x * runner.weight + 1.0)
