"""A graph's static output handed to the caller and held across the next replay of the same graph
(class 19 of the reference notes: PyTorch #148439, cudagraph trees' "accessing tensor output of
CUDAGraphs that has been overwritten by a subsequent run":
https://github.com/pytorch/pytorch/issues/148439; vLLM #9724, graph outputs kept as weak references:
https://github.com/vllm-project/vllm/pull/9724). Two forms, from diffusion and encoder runners:

- held: classifier-free guidance runs the conditional and the unconditional branch through one graph
  (the same shapes, so the same static output: SGLang #27436's "Clone so the caller can hold the
  result across the next replay / the other CFG branch":
  https://github.com/sgl-project/sglang/pull/27436). Returned without a clone, the conditional
  result is the unconditional one by the time guidance reads it: silently on CUDA as on the
  emulated device; `explain_against_eager` names guidance's read and the replay that rewrote it.
  Fixed: the runner clones the output before returning it.
- cloned on another stream: the runner clones the output on the consumer's stream and returns, and
  the next request's replay on the scheduler stream rewrites the output before the clone ran
  (sglang-omni #1369, "The clone is asynchronous, so releasing this CPU lock can let the scheduler
  stream overwrite static_out before the pre-LM stream finishes copying it":
  https://github.com/sgl-project/sglang-omni/pull/1369). The stream tracking reports the replay's
  write racing the clone's read. Fixed: an event recorded after each clone, waited on before the
  next replay touches the static buffers."""

from __future__ import annotations

import pytest
import torch

from harness.check.explain_cuda import explain_against_eager
from harness.emulation import emulation_active, track_stream_races
from harness.emulation.tracking import RaceError

SIZE, SCALE = 8, 3.0


class Denoiser:
    def __init__(self, *, clones: bool) -> None:
        self.clones = clones
        self.weight = torch.linspace(0.5, 2.0, SIZE, device="cuda")
        self.static_input = torch.zeros(SIZE, device="cuda")
        self.graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph):
            self.static_output = self.model(self.static_input)

    def model(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight + 1

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.static_input.copy_(x)
        self.graph.replay()
        return self.static_output.clone() if self.clones else self.static_output


def _guided(model, cond: torch.Tensor, uncond: torch.Tensor) -> torch.Tensor:
    eps_cond = model(cond)
    eps_uncond = model(uncond)
    return eps_uncond + SCALE * (eps_cond - eps_uncond)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(float(SIZE), device="cuda"), torch.zeros(SIZE, device="cuda")


def _explained(*, clones: bool):
    def graphed():
        return _guided(Denoiser(clones=clones), *_inputs())

    def eager():
        runner = Denoiser.__new__(Denoiser)
        runner.weight = torch.linspace(0.5, 2.0, SIZE, device="cuda")
        return _guided(runner.model, *_inputs())

    return explain_against_eager(graphed, eager)


def test_the_held_conditional_result_is_the_unconditional_one():
    cond, uncond = _inputs()
    guided = _guided(Denoiser(clones=False), cond, uncond)
    torch.cuda.synchronize()
    assert guided.tolist() == [1.0] * SIZE  # eps_cond - eps_uncond is zero: no guidance at all
    assert _guided(Denoiser(clones=True), cond, uncond).tolist() != [1.0] * SIZE


@pytest.mark.explains_against_eager
def test_the_guidance_read_of_the_rewritten_output_is_named():
    found = _explained(clones=False)
    assert found.diverged, found
    assert found.op == "aten.sub.Tensor", found
    assert "test_static_output_held_across_replays.py" in found.where, found
    assert "eps_cond - eps_uncond" in found.where, found
    assert found.graph.startswith("not a replayed op"), found  # guidance runs eagerly
    assert found.cause is not None, found
    assert "last written by graph 1, replay 2" in found.cause.detail, found.cause
    assert "cloned" in found.cause.detail, found.cause


@pytest.mark.explains_against_eager
def test_a_cloned_output_guides_as_eager_does():
    found = _explained(clones=True)
    assert not found.diverged, found
    assert found.replays_compared == 2


class EncoderRunner:
    """sglang-omni's encoder graph: requests come in on the scheduler stream; each result is cloned
    on the pre-LM stream that consumes it."""

    def __init__(self, *, waits_for_the_clone: bool) -> None:
        self.waits = waits_for_the_clone
        self.consumer = torch.cuda.Stream()
        self.static_input = torch.zeros(1 << 12, device="cuda")
        self.graph = torch.cuda.CUDAGraph()
        self.cloned = torch.cuda.Event()
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph):
            self.static_output = self.static_input * 2 + 1

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        if self.waits:
            torch.cuda.current_stream().wait_event(self.cloned)  # the last clone has read static_output
        self.static_input.copy_(x)
        self.graph.replay()
        self.consumer.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.consumer):
            result = self.static_output.clone()
            self.cloned.record()
        return result


def _encoded(*, waits_for_the_clone: bool) -> list[float]:
    runner = EncoderRunner(waits_for_the_clone=waits_for_the_clone)
    torch.cuda.synchronize()
    with track_stream_races():
        first = runner.encode(torch.full((1 << 12,), 1.0, device="cuda"))
        runner.encode(torch.full((1 << 12,), 5.0, device="cuda"))
        torch.cuda.synchronize()
        return [first[0].item(), first[-1].item()]


@pytest.mark.strict_races
def test_the_next_replay_races_the_asynchronous_clone():
    with pytest.raises(RaceError, match="test_static_output_held_across_replays.py") as caught:
        _encoded(waits_for_the_clone=False)
    if emulation_active() == "cpu":
        assert "replay of CUDAGraph" in str(caught.value), caught.value
    assert "self.static_output.clone()" in str(caught.value), caught.value


@pytest.mark.strict_races
def test_waiting_for_the_clone_before_the_next_replay_keeps_the_first_result():
    assert _encoded(waits_for_the_clone=True) == [3.0, 3.0]
