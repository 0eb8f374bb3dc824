"""`torch.utils.swap_tensors` of a captured tensor on each graph backend, outside the emulated CUDA
device. The backends watch every captured tensor through a weak reference, and torch refuses to
swap a tensor with one: before watch_refs.py a correct runtime that swapped a captured parameter
(`module.to()` with swapped conversion) and then recaptured was stopped at the swap. Now the swap
happens, as on CUDA, and a replay of the old graph is refused, as for `set_()`."""

from __future__ import annotations

import weakref

import pytest
import torch

from harness.graphs.base import FreedMemoryError, StorageChangedError


def _weight_and_graph(backend):
    weight, out = torch.ones(4, device=backend.device), torch.zeros(4, device=backend.device)
    graph = backend.capture(lambda: out.copy_(weight * 3))
    graph.replay()
    return weight, out, graph


def test_a_swapped_captured_tensor_refuses_the_old_graphs_replay(backend):
    weight, out, graph = _weight_and_graph(backend)
    loaded = torch.full((4,), 2.0, device=backend.device)
    torch.utils.swap_tensors(weight, loaded)
    assert weight.tolist() == [2.0] * 4 and loaded.tolist() == [1.0] * 4
    with pytest.raises(StorageChangedError, match="changed its storage"):
        graph.replay()


def test_a_swap_followed_by_a_recapture_replays_the_new_values(backend):
    weight, out, graph = _weight_and_graph(backend)
    torch.utils.swap_tensors(weight, torch.full((4,), 2.0, device=backend.device))
    graph.reset()
    graph = backend.capture(lambda: out.copy_(weight * 3))
    graph.replay()
    backend.synchronize()
    assert out.tolist() == [6.0] * 4


def test_a_module_converted_with_swapped_parameters_after_capture(backend):
    layer = torch.nn.Linear(4, 4, bias=False).to(backend.device)
    x, out = torch.ones(1, 4, device=backend.device), torch.zeros(1, 4, device=backend.device)
    with torch.no_grad():
        graph = backend.capture(lambda: out.copy_(layer(x)))
    previous = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        layer.to(torch.float64).to(torch.float32)  # each conversion swaps the parameter
    finally:
        torch.__future__.set_swap_module_params_on_conversion(previous)
    if backend.name == "cuda":
        # CUDA's allocator handed the freed captured block to the converted weight (measured on
        # an H100): the address is the same, so a replay reads whatever owns it now
        return
    # the parameter object now shows the converted memory; the captured one is freed
    with pytest.raises((StorageChangedError, FreedMemoryError)):
        graph.replay()


def test_a_programs_own_weak_reference_still_blocks_the_swap(backend):
    weight, _, graph = _weight_and_graph(backend)
    held = weakref.ref(weight)
    with pytest.raises(RuntimeError, match="Cannot swap t1 because it has weakref associated"):
        torch.utils.swap_tensors(weight, torch.zeros(4, device=backend.device))
    assert held() is weight
    graph.replay()  # nothing was swapped
