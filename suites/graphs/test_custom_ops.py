"""Rule 5: a torch.library custom op is recorded and replayed as one op, with its mutates_args
honoured."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import CaptureError

CALLS: list[str] = []


@torch.library.custom_op("graphs_suite::scaled_add", mutates_args=())
def scaled_add(x: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
    CALLS.append("scaled_add")
    return x + scale * y


@scaled_add.register_fake
def _(x, y, scale):
    return torch.empty_like(x)


@torch.library.custom_op("graphs_suite::accumulate_into", mutates_args=("acc", "out"))
def accumulate_into(x: torch.Tensor, acc: torch.Tensor, out: torch.Tensor) -> None:
    CALLS.append("accumulate_into")
    acc.add_(x)
    out.copy_(acc * 2)


@torch.library.custom_op("graphs_suite::no_fake", mutates_args=())
def no_fake(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@torch.library.custom_op("graphs_suite::with_workspace", mutates_args=())
def with_workspace(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x * 2, torch.zeros(1024, device=x.device)  # a workspace whose size only the kernel knows


@with_workspace.register_fake
def _(x):
    return torch.empty_like(x), x.new_empty(0)  # as cuDNN's RNN reserve: its fake cannot size it


@torch.library.custom_op("graphs_suite::with_seed", mutates_args=())
def with_seed(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x + 1, torch.full((), 5, dtype=torch.int64, device=x.device)  # a 0-dim seed, as SDPA's


@with_seed.register_fake
def _(x):
    return torch.empty_like(x), x.new_empty((2, 2), dtype=torch.int64)  # its fake shapes it otherwise


def test_a_scalar_result_its_fake_shaped_otherwise_fills_the_captured_output(backend):
    x = torch.ones(4, device=backend.device)
    graph = backend.capture(lambda: with_seed(x))
    graph.replay()
    backend.synchronize()
    out, seed = graph.output
    assert torch.equal(out, torch.full((4,), 2.0, device=backend.device))
    if backend.name == "emulated":
        assert seed.shape == (2, 2) and bool((seed == 5).all())


def test_an_output_its_fake_leaves_empty_replays_and_the_others_hold_their_results(backend):
    x = torch.ones(4, device=backend.device)
    graph = backend.capture(lambda: with_workspace(x)[0] + 1)
    x.fill_(3.0)
    graph.replay()
    backend.synchronize()
    assert torch.equal(graph.output, torch.full((4,), 7.0, device=backend.device))


def test_functional_custom_op_is_replayed_as_one_op(backend):
    x = torch.ones(4, device=backend.device)
    y = torch.arange(4.0, device=backend.device)
    CALLS.clear()
    graph = backend.capture(lambda: scaled_add(x, y, 0.5) * 2)
    calls_at_capture = len(CALLS)
    y.fill_(2.0)
    graph.replay()
    graph.replay()
    backend.synchronize()
    assert torch.equal(graph.output, torch.full((4,), 4.0, device=backend.device))
    if backend.name == "emulated":
        assert calls_at_capture == 0  # capture runs nothing ...
        assert CALLS == ["scaled_add", "scaled_add"]  # ... and each replay calls the op once


def test_mutating_custom_op_writes_its_mutated_args_at_each_replay(backend):
    x = torch.ones(3, device=backend.device)
    acc = torch.zeros(3, device=backend.device)
    out = torch.zeros(3, device=backend.device)
    graph = backend.capture(lambda: accumulate_into(x, acc, out))
    assert graph.output is None
    if backend.name == "emulated":
        assert not acc.any() and not out.any()
    acc.zero_()
    graph.replay()
    graph.replay()
    backend.synchronize()
    assert torch.equal(acc, torch.full((3,), 2.0, device=backend.device))
    assert torch.equal(out, torch.full((3,), 4.0, device=backend.device))


def test_mutating_custom_op_inside_a_larger_graph(backend):
    x = torch.arange(3.0, device=backend.device)
    acc = torch.zeros(3, device=backend.device)
    out = torch.empty(3, device=backend.device)

    def fn():
        h = x * 2
        accumulate_into(h, acc, out)
        return out + 1

    graph = backend.capture(fn)
    acc.zero_()
    graph.replay()
    backend.synchronize()
    assert torch.equal(graph.output, x * 4 + 1)


def test_functional_custom_op_without_a_fake_needs_register_fake_on_the_emulator(emulated):
    x = torch.ones(2)
    with pytest.raises(CaptureError) as caught:
        emulated.capture(lambda: no_fake(x))
    assert "register_fake" in str(caught.value)
    assert caught.value.op == "graphs_suite.no_fake.default"
