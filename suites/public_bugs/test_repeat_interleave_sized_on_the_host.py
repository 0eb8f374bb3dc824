"""Token routing that expands each expert's slot by its token count with `repeat_interleave` inside
a captured MoE step. Without `output_size` the op reads the counts' sum on the host to size its
result (`cumsum[-1].item()`), a sync that CUDA refuses during a capture; given the size the host
already knows, it reads nothing and is captured (PyTorch #58417 made `output_size` skip the sync;
diffusers #11030 and torchtitan #3274 pass it for that reason). The harness gives CUDA's error for
the first, naming the op and the line; the second replays each step's routing (until 2026-12-07 the
emulated device refused it too, reading the op's dynamic-shape tag, docs/fidelity.md "A fifth
sweep")."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import CaptureInvalidatedError, CaptureSyncError

from suites.public_bugs._refusals import stream_kept

NOT_PERMITTED = "CUDA error: operation not permitted when stream is capturing"
SLOTS = 8  # the capacity the runtime sized for: every step routes exactly this many tokens


def _route(counts: torch.Tensor, *, sized: bool) -> torch.Tensor:
    experts = torch.arange(counts.numel(), device=counts.device)
    if sized:
        return torch.repeat_interleave(experts, counts, output_size=SLOTS)
    return torch.repeat_interleave(experts, counts)


def _captured(sized: bool):
    counts = torch.tensor([2, 2, 2, 2], device="cuda")
    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        _route(counts, sized=sized)
    torch.cuda.current_stream().wait_stream(warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        expert_of_slot = _route(counts, sized=sized)
    return graph, counts, expert_of_slot


def test_routing_sized_from_the_counts_is_refused_in_cudas_words():
    # as on CUDA, capture_end fails after the refused call, which is its context
    with stream_kept(), pytest.raises(CaptureInvalidatedError) as ended:
        _captured(sized=False)
    refused = ended.value.__context__
    assert isinstance(refused, CaptureSyncError), refused
    assert str(refused).startswith(NOT_PERMITTED), refused
    assert "repeat_interleave" in str(refused)
    assert "test_repeat_interleave_sized_on_the_host.py" in str(refused)  # the user's line


def test_routing_given_its_size_is_captured_and_follows_each_steps_counts():
    graph, counts, expert_of_slot = _captured(sized=True)
    counts.copy_(torch.tensor([1, 0, 4, 3]))
    graph.replay()
    assert expert_of_slot.tolist() == [0, 2, 2, 2, 2, 3, 3, 3]
    counts.copy_(torch.tensor([0, 5, 0, 3]))
    graph.replay()
    assert expert_of_slot.tolist() == [1, 1, 1, 1, 1, 3, 3, 3]
