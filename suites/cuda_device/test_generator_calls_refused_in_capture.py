"""Generator calls that CUDA refuses while the current stream captures, whatever the seed:
`Generator.clone_state()` (CUDAGeneratorImpl::clone_impl asserts no capture: there is no graph-safe
clone, PyTorch #170535) and `torch.cuda.seed()`/`seed_all()` (CUDAGeneratorImpl::seed asserts
before it draws). Each is refused in at::cuda::assertNotCapturing's words. What a capture allows
in their place: `torch.cuda.get_rng_state()`/`set_rng_state()` rewind the graph's own position
(PyTorch #162505), so a replay draws one mask twice and fresh masks across replays. The rows run
natively on a GPU too, where the verdicts are CUDA's own."""

from __future__ import annotations

import pytest
import torch

NOT_CAPTURING = ("during CUDA graph capture. If you need this call to be captured, please file an "
                 "issue. Current cudaStreamCaptureStatus: cudaStreamCaptureStatusActive")


def _capture(body) -> None:
    x = torch.ones(8, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
        x.mul_(2)


def test_clone_state_is_refused_during_capture(cuda_kind):
    if cuda_kind == "sanitizer":
        pytest.skip("the sanitizer's generators are CUDA's own, whose clone_state asks the real "
                    "stream, which a sanitizer capture leaves uncapturing (docs/fidelity.md)")
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    with pytest.raises(RuntimeError, match="Cannot call CUDAGeneratorImpl::clone_impl " + NOT_CAPTURING):
        _capture(generator.clone_state)
    assert generator.clone_state().initial_seed() == generator.initial_seed()  # allowed after


@pytest.mark.parametrize("call", ["seed", "seed_all"])
def test_a_fresh_seed_is_refused_during_capture(cuda_kind, call):
    with pytest.raises(RuntimeError, match="Cannot call CUDAGeneratorImpl::seed " + NOT_CAPTURING):
        _capture(lambda: getattr(torch.cuda, call)())  # looked up as the capture calls it


def test_get_and_set_rng_state_rewind_within_each_replay(cuda_kind):
    torch.cuda.manual_seed(7)
    first, again = torch.zeros(64, device="cuda"), torch.zeros(64, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        saved = torch.cuda.get_rng_state()
        first.copy_(torch.rand(64, device="cuda"))
        torch.cuda.set_rng_state(saved)
        again.copy_(torch.rand(64, device="cuda"))
    draws = []
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(first, again)
        draws.append(first.clone())
    assert not torch.equal(draws[0], draws[1])
