"""Common op shapes a runtime captures: views, tuple outputs, factories, in-place chains on
pre-existing and captured tensors, random ops, constants and scalar arguments."""

from __future__ import annotations

import torch


def _replayed(backend, fn):
    graph = backend.capture(fn)
    graph.replay()
    backend.synchronize()
    return graph


def test_views_of_captured_outputs_follow_replays(backend):
    x = torch.arange(12.0, device=backend.device)
    graph = backend.capture(lambda: (x * 2).view(3, 4).t()[1:])
    x.add_(1)
    graph.replay()
    backend.synchronize()
    assert graph.output.shape == (3, 3)
    assert torch.equal(graph.output, (x * 2).view(3, 4).t()[1:])


def test_tuple_outputs(backend):
    x = torch.tensor([3.0, 1.0, 4.0, 1.5, 9.0, 2.0], device=backend.device)
    graph = _replayed(backend, lambda: torch.topk(x, 2))
    values, indices = graph.output
    assert torch.equal(values, torch.tensor([9.0, 4.0], device=backend.device))
    assert torch.equal(indices, torch.tensor([4, 2], device=backend.device))


def test_factory_ops(backend):
    device = backend.device

    def fn():
        z = torch.zeros(4, device=device)
        o = torch.ones(4, device=device, dtype=torch.int32)
        f = torch.full((4,), 2.5, device=device)
        r = torch.arange(4, device=device)
        e = torch.empty(4, device=device).fill_(7.0)
        return z + f * r + o + e

    graph = _replayed(backend, fn)
    assert torch.equal(graph.output, torch.tensor([8.0, 10.5, 13.0, 15.5], device=device))


def test_in_place_chain_on_a_captured_tensor(backend):
    x = torch.arange(5.0, device=backend.device)

    def fn():
        y = x * 1
        y.add_(1).mul_(2).clamp_(max=7.0)
        return y

    graph = _replayed(backend, fn)
    assert torch.equal(graph.output, torch.tensor([2.0, 4.0, 6.0, 7.0, 7.0], device=backend.device))


def test_in_place_ops_on_preexisting_tensors_run_only_at_replay(backend):
    cache = torch.zeros(4, 2, device=backend.device)
    rows = torch.tensor([3, 0], device=backend.device)
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=backend.device)
    scratch = torch.zeros(4, device=backend.device)
    scratch_values = torch.tensor([5.0, 6.0], device=backend.device)

    def fn():
        cache.index_copy_(0, rows, values)
        scratch.index_put_((rows,), scratch_values)
        return cache.sum(1) + scratch

    graph = backend.capture(fn)
    backend.synchronize()
    assert not cache.any() and not scratch.any()
    graph.replay()
    backend.synchronize()
    assert torch.equal(graph.output, torch.tensor([13.0, 0.0, 0.0, 8.0], device=backend.device))


def test_copy_from_a_preexisting_tensor_into_a_captured_one(backend):
    source = torch.arange(4.0, device=backend.device)

    def fn():
        dst = torch.empty(4, device=backend.device)
        dst.copy_(source)
        return dst.mul_(3)

    graph = backend.capture(fn)
    source.fill_(1.0)
    graph.replay()
    backend.synchronize()
    assert torch.equal(graph.output, torch.full((4,), 3.0, device=backend.device))


def test_scalar_arguments(backend):
    x = torch.ones(3, device=backend.device)
    graph = _replayed(backend, lambda: (x * 2.5 + 1 - torch.arange(1, 4, device=x.device)) / 2)
    assert torch.equal(graph.output, torch.tensor([1.25, 0.75, 0.25], device=backend.device))


def test_casts_and_reductions(backend):
    x = torch.arange(6, device=backend.device).view(2, 3)
    graph = _replayed(backend, lambda: (x.float().softmax(-1), x.to(torch.bfloat16).sum(0), x.max(1)))
    soft, total, (values, indices) = graph.output
    assert torch.allclose(soft, torch.softmax(x.float(), -1))
    assert torch.equal(total, x.to(torch.bfloat16).sum(0))
    assert torch.equal(values, torch.tensor([2, 5], device=backend.device))
    assert torch.equal(indices, torch.tensor([2, 2], device=backend.device))


def test_random_ops_draw_fresh_values_at_each_replay(backend):
    x = torch.zeros(64, device=backend.device)
    graph = backend.capture(lambda: (torch.rand(64, device=backend.device), x + torch.randn_like(x)))
    draws = []
    for _ in range(2):
        graph.replay()
        backend.synchronize()
        draws.append(tuple(t.clone() for t in graph.output))
    assert not torch.equal(draws[0][0], draws[1][0])
    assert not torch.equal(draws[0][1], draws[1][1])
    assert 0.0 <= draws[1][0].min() and draws[1][0].max() < 1.0
