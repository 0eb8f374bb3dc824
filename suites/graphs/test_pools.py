"""Rule 4: private pools. Outputs are overwritten by every replay; graphs in one pool may reuse
each other's freed memory (as CUDA's caching allocator does); separate pools never share."""

from __future__ import annotations

import torch

N = 256  # 1 KiB of float32: two such blocks never merge into one best fit for a third


def test_output_held_across_two_replays_changes_under_the_holder(backend):
    x = torch.zeros(4, device=backend.device)
    graph = backend.capture(lambda: x * 2)
    held = graph.output
    x.fill_(1.0)
    graph.replay()
    backend.synchronize()
    first = held.clone()
    x.fill_(5.0)
    graph.replay()
    backend.synchronize()
    assert held is graph.output
    assert torch.equal(first, torch.full((4,), 2.0, device=backend.device))
    assert torch.equal(held, torch.full((4,), 10.0, device=backend.device))


def _two_graphs(backend, shared: bool):
    x = torch.full((N,), 1.0, device=backend.device)
    y = torch.full((N,), 10.0, device=backend.device)
    addresses = {}

    def first():
        intermediate = x + 1
        addresses["intermediate"] = intermediate.data_ptr()
        return intermediate * 2  # the intermediate is freed when this returns

    a = backend.capture(first)
    b = backend.capture(lambda: y + 100, pool=a.pool if shared else None)
    return a, b, addresses["intermediate"], (x, y)  # the inputs must outlive the graphs


def test_two_graphs_in_one_pool_alias_a_freed_intermediate(backend):
    a, b, intermediate, _inputs = _two_graphs(backend, shared=True)
    assert b.output.data_ptr() == intermediate
    b.replay()
    a.replay()  # out of capture order: a's intermediate overwrites b's output
    backend.synchronize()
    assert torch.equal(a.output, torch.full((N,), 4.0, device=backend.device))
    assert torch.equal(b.output, torch.full((N,), 2.0, device=backend.device))


def test_two_graphs_in_separate_pools_do_not_alias(backend):
    a, b, intermediate, _inputs = _two_graphs(backend, shared=False)
    assert b.output.data_ptr() != intermediate
    b.replay()
    a.replay()
    backend.synchronize()
    assert torch.equal(b.output, torch.full((N,), 110.0, device=backend.device))


def test_graph_in_a_pool_handle_shares_it(backend):
    pool = backend.graph_pool_handle()
    x = torch.ones(N, device=backend.device)
    a = backend.capture(lambda: x + 1, pool=pool)
    b = backend.capture(lambda: x + 2, pool=pool)
    a.replay()
    b.replay()
    backend.synchronize()
    assert a.output.data_ptr() != b.output.data_ptr()  # both outputs are alive: no reuse
    assert torch.equal(a.output + 1, b.output)


def test_dropped_intermediate_is_reused_within_a_capture(backend):
    x = torch.ones(N, device=backend.device)
    addresses = []

    def fn():
        first = x + 1
        addresses.append(first.data_ptr())
        second = first * 2
        del first
        third = second + 1
        addresses.append(third.data_ptr())
        return third

    graph = backend.capture(fn)
    graph.replay()
    backend.synchronize()
    assert addresses[0] == addresses[1]
    assert torch.equal(graph.output, torch.full((N,), 5.0, device=backend.device))


def test_dropped_output_is_reused_by_a_later_graph_in_the_pool(backend):
    x = torch.ones(N, device=backend.device)
    a = backend.capture(lambda: x + 1)
    address = a.output.data_ptr()
    a.output = None
    b = backend.capture(lambda: x + 7, pool=a.pool)
    assert b.output.data_ptr() == address


def test_output_kept_alive_by_a_view_is_not_reused(backend):
    x = torch.ones(N, device=backend.device)
    a = backend.capture(lambda: x + 1)
    view = a.output[N // 2:]
    address = a.output.data_ptr()
    a.output = None
    b = backend.capture(lambda: x + 7, pool=a.pool)
    assert b.output.data_ptr() != address
    a.replay()
    backend.synchronize()
    assert torch.equal(view, torch.full((N // 2,), 2.0, device=backend.device))
