"""`torch.utils.swap_tensors` on a tensor a capture met: CUDA swaps, and the graph keeps reading
the memory the tensor had at capture (now the other object's); the harness lets the swap happen
past its own weak references and refuses the next replay, as for `set_()` and `.data = ...`. A
program's own weak reference still makes torch refuse the swap, on every device."""

from __future__ import annotations

import weakref

import pytest
import torch

from harness.graphs.base import StorageChangedError


def _captured() -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
    weight, out = torch.ones(4, device="cuda"), torch.zeros(4, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(weight * 3)
    graph.replay()
    return graph, weight, out


def test_a_captured_tensor_swapped_away_is_refused_at_the_next_replay(cuda_kind):
    graph, weight, out = _captured()
    loaded = torch.full((4,), 2.0, device="cuda")
    torch.utils.swap_tensors(weight, loaded)  # as module.to() does with swapped parameters
    assert weight.tolist() == [2.0] * 4 and loaded.tolist() == [1.0] * 4
    if cuda_kind == "native":
        graph.replay()  # CUDA: the captured memory, now `loaded`'s ones, not the new weight
        torch.cuda.synchronize()
        assert out.tolist() == [3.0] * 4
        return
    with pytest.raises(StorageChangedError, match=r"storage swap[\s\S]*recapture") as caught:
        graph.replay()
    assert "out.copy_(weight * 3)" in str(caught.value)


def test_copying_the_new_values_in_replays_them(cuda_kind):
    graph, weight, out = _captured()
    weight.copy_(torch.full((4,), 2.0, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert out.tolist() == [6.0] * 4


def test_a_programs_own_weak_reference_still_blocks_the_swap(cuda_kind):
    graph, weight, _ = _captured()
    held = weakref.ref(weight)
    with pytest.raises(RuntimeError, match="Cannot swap t1 because it has weakref associated"):
        torch.utils.swap_tensors(weight, torch.zeros(4, device="cuda"))
    assert held() is weight
    graph.replay()  # nothing was swapped
