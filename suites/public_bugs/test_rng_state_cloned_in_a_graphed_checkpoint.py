"""A recomputed dropout layer (activation checkpointing inside a graphed training step, as
Megatron's and TransformerEngine's graphed checkpoints do) saves the generator's state with
`Generator.clone_state()` before the forward's draw, to draw the same mask again in the recompute
(PyTorch #170535, "Graphsafe RNG clone_state": https://github.com/pytorch/pytorch/issues/170535;
`torch.utils.checkpoint` under capture, #162504: https://github.com/pytorch/pytorch/issues/162504).
CUDA refuses the clone inside the capture: CUDAGeneratorImpl::clone_impl asserts no capture,
"Cannot call CUDAGeneratorImpl::clone_impl during CUDA graph capture. If you need this call to be
captured, please file an issue. Current cudaStreamCaptureStatus: cudaStreamCaptureStatusActive".
The emulated device cloned it silently before 2026-12-06. Fixed (PyTorch #162505,
https://github.com/pytorch/pytorch/pull/162505): `torch.cuda.get_rng_state()` and
`set_rng_state()`, which a capture allows while the seed stays, rewind the graph's own position,
so each replay recomputes the forward's mask and the next replay draws a new one.
On a GPU the file runs on CUDA itself (the refusal is CUDA's)."""

from __future__ import annotations

import pytest
import torch

from harness.emulation import emulation_active


N, P = 256, 0.5


# CUDA where there is one, else the emulated device (conftest.py)
RUNS_NATIVELY_ON_A_GPU = True


class RecomputedDropout:
    """The forward's mask and the recompute's, each drawn into a static buffer of the graph."""

    def __init__(self, *, clones_the_generator: bool) -> None:
        self.clones = clones_the_generator
        self.x = torch.ones(N, device="cuda")
        self.forward_out = torch.zeros(N, device="cuda")
        self.recompute_out = torch.zeros(N, device="cuda")
        self.graph = torch.cuda.CUDAGraph()

    def _dropout(self, out: torch.Tensor) -> None:
        out.copy_(self.x * (torch.rand(N, device="cuda") > P) / (1 - P))

    def step(self) -> None:
        if self.clones:
            generator = torch.cuda.default_generators[torch.cuda.current_device()]
            saved = generator.clone_state()  # CheckpointFunction.forward's snapshot
            self._dropout(self.forward_out)
            generator.graphsafe_set_state(saved)
        else:
            saved = torch.cuda.get_rng_state()  # what torch.utils.checkpoint saves
            self._dropout(self.forward_out)
            torch.cuda.set_rng_state(saved)
        self._dropout(self.recompute_out)

    def capture(self) -> None:
        torch.cuda.manual_seed(1234)
        self.step()  # warmup, eagerly
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph):
            self.step()


def test_cloning_the_generator_inside_the_capture_is_refused():
    if emulation_active() == "cuda":
        pytest.skip("the graph sanitizer's generators are CUDA's own, whose clone_state asks the real "
                    "stream, which a sanitizer capture leaves uncapturing (docs/fidelity.md)")
    layer = RecomputedDropout(clones_the_generator=True)
    with pytest.raises(RuntimeError, match=r"Cannot call CUDAGeneratorImpl::clone_impl during CUDA "
                       r"graph capture\. If you need this call to be captured, please file an "
                       r"issue\. Current cudaStreamCaptureStatus: cudaStreamCaptureStatusActive"):
        layer.capture()


def test_the_rewound_state_recomputes_the_forwards_mask_at_each_replay():
    layer = RecomputedDropout(clones_the_generator=False)
    layer.capture()
    masks = []
    for _ in range(3):
        layer.graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(layer.forward_out, layer.recompute_out)
        masks.append(layer.forward_out.clone())
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
    assert 0 < int((masks[0] == 0).sum()) < N  # a dropout mask, not all kept nor all dropped


def test_torch_checkpoint_under_capture_matches_eager_gradients():
    """PyTorch #162504's own example: `torch.utils.checkpoint` with `preserve_rng_state=True`
    captured with its backward, replayed from the same seed, gives eager's gradient."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(torch.randn(1, device="cuda"))

    fn(torch.ones(1, device="cuda"))  # initialize device state
    torch.cuda.manual_seed(42)
    eager_in = torch.ones(1, device="cuda", requires_grad=True)
    eager_out = torch.utils.checkpoint.checkpoint(fn, eager_in, use_reentrant=False,
                                                  preserve_rng_state=True)
    eager_grad, = torch.autograd.grad(eager_out, eager_in)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        graph_in = torch.ones(1, device="cuda", requires_grad=True)
        graph_out = torch.utils.checkpoint.checkpoint(fn, graph_in, use_reentrant=False,
                                                      preserve_rng_state=True)
        graph_grad, = torch.autograd.grad(graph_out, graph_in)
    torch.cuda.manual_seed(42)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(eager_grad, graph_grad)
