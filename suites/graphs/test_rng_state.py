"""Random-number generator state inside a capture. CUDA's graph-safe generators record a get and a
set of the device generator's state during capture, so a replay rewinds where the code rewound
(checkpointing with preserve_rng_state recomputes the same dropout); reseeding to another seed
during capture is refused, the same seed is allowed; an empty graph warns."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from harness.graphs import CaptureError


def _seed(backend, seed: int) -> None:
    """Seed the generator the backend's device draws from."""
    if backend.device.type == "cuda":
        torch.cuda.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def _state_functions(backend):
    if backend.device.type == "cuda":
        return (lambda: torch.cuda.get_rng_state(backend.device),
                lambda state: torch.cuda.set_rng_state(state, backend.device))
    return (lambda: torch.get_rng_state()), (lambda state: torch.set_rng_state(state))


def test_checkpoint_preserve_rng_state_gives_the_eager_gradient(backend):
    # PyTorch's test_graph_checkpoint_preserve_rng_state, on every backend.
    device = backend.device

    def fn(x):
        return x * torch.sigmoid(torch.randn(1, device=device))

    fn(torch.ones(1, device=device))
    _seed(backend, 42)
    eager_in = torch.ones(1, device=device, requires_grad=True)
    eager_out = checkpoint(fn, eager_in, use_reentrant=False, preserve_rng_state=True)
    (eager_grad,) = torch.autograd.grad(eager_out, eager_in)

    def step():
        graph_in = torch.ones(1, device=device, requires_grad=True)
        graph_out = checkpoint(fn, graph_in, use_reentrant=False, preserve_rng_state=True)
        return torch.autograd.grad(graph_out, graph_in)[0]

    graph = backend.capture(step)
    _seed(backend, 42)
    graph.replay()
    backend.synchronize()
    torch.testing.assert_close(graph.output, eager_grad, rtol=0, atol=0)


def test_state_set_back_repeats_the_draw_at_every_replay(backend):
    get_state, set_state = _state_functions(backend)

    def fn():
        state = get_state()
        first = torch.rand(4, device=backend.device)
        set_state(state)
        return first, torch.rand(4, device=backend.device)

    graph = backend.capture(fn)
    graph.replay()
    backend.synchronize()
    first, again = (t.clone() for t in graph.output)
    assert torch.equal(first, again)
    graph.replay()
    backend.synchronize()
    assert torch.equal(graph.output[0], graph.output[1])
    assert not torch.equal(graph.output[0], first)  # each replay still draws fresh values


def test_fork_rng_rewinds_at_every_replay(backend):
    devices = [backend.device.index] if backend.device.type == "cuda" else []

    def fn():
        with torch.random.fork_rng(devices=devices, device_type="cuda"):
            inside = torch.rand(4, device=backend.device)
        return inside, torch.rand(4, device=backend.device)

    graph = backend.capture(fn)
    graph.replay()
    backend.synchronize()
    assert torch.equal(graph.output[0], graph.output[1])


def test_dropout_under_checkpoint_matches_eager_gradient(backend):
    # Model-shaped: a block with dropout, checkpointed; the recompute must draw the same mask.
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    block = block.to(backend.device).train()
    x = torch.randn(4, 8, device=backend.device)

    def grads():
        block.zero_grad(set_to_none=True)
        out = checkpoint(block, x, use_reentrant=False, preserve_rng_state=True)
        return torch.autograd.grad(out.sum(), list(block.parameters()))

    _seed(backend, 7)
    eager = grads()
    graph = backend.capture(grads)
    _seed(backend, 7)
    graph.replay()
    backend.synchronize()
    for replayed, expected in zip(graph.output, eager):
        torch.testing.assert_close(replayed, expected)


def test_reseeding_to_another_seed_during_capture_is_refused(backend):
    _seed(backend, 1234)
    x = torch.ones(3, device=backend.device)

    def fn():
        torch.manual_seed(99)
        return x * 2

    with pytest.raises(CaptureError) as caught:
        backend.capture(fn)
    if backend.name == "emulated":
        assert "torch.manual_seed" in str(caught.value) and "99" in str(caught.value)
        assert "test_rng_state.py" in str(caught.value)


def test_reseeding_to_the_same_seed_during_capture_is_allowed(backend):
    torch.manual_seed(1234)
    x = torch.ones(3, device=backend.device)

    def fn():
        torch.manual_seed(1234)
        return x * 2

    graph = backend.capture(fn)
    graph.replay()
    backend.synchronize()
    assert torch.equal(graph.output, torch.full((3,), 2.0, device=backend.device))


def test_reseeding_the_generator_object_during_capture_is_refused(backend):
    generator = (torch.cuda.default_generators[backend.device.index] if backend.device.type == "cuda"
                 else torch.default_generator)
    generator.manual_seed(1234)
    x = torch.ones(3, device=backend.device)

    def fn():
        generator.manual_seed(99)
        return x * 2

    with pytest.raises(CaptureError):
        backend.capture(fn)
    generator.manual_seed(1234)


def test_an_empty_graph_warns(backend):
    x = torch.ones(3, device=backend.device)
    with pytest.warns(UserWarning, match=r"^The CUDA Graph is empty"):
        backend.capture(lambda: x.view(3, 1))


def test_a_graph_with_work_does_not_warn(backend):
    x = torch.ones(3, device=backend.device)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        backend.capture(lambda: x * 2)
