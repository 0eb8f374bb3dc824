"""Rules 0-2 of the contract: capture runs nothing, static addresses, frozen host logic."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import FreedMemoryError
from harness.graphs.emulator.pool import is_poisoned


def test_capture_leaves_preexisting_tensors_unchanged(backend):
    x = torch.arange(8.0, device=backend.device)
    before = x.clone()

    def fn():
        x.add_(1)
        x.mul_(3)
        return x * 2

    graph = backend.capture(fn)
    backend.synchronize()
    assert torch.equal(x, before)
    graph.replay()
    backend.synchronize()
    assert torch.equal(x, (before + 1) * 3)


def test_captured_output_is_undefined_until_the_first_replay(backend):
    x = torch.arange(8.0, device=backend.device)
    graph = backend.capture(lambda: (x + 1, (x > 3).to(torch.int64)))
    values, flags = graph.output
    if backend.name == "emulated":
        # The emulator poisons capture-time results so a premature read fails loudly.
        assert is_poisoned(values) and is_poisoned(flags)
    graph.replay()
    backend.synchronize()
    assert torch.equal(values, x + 1)
    assert torch.equal(flags, (x > 3).to(torch.int64))


def test_replay_reads_static_inputs_by_address(backend):
    static_in = torch.zeros(4, device=backend.device)
    graph = backend.capture(lambda: static_in * 10)
    for value in (1.0, 2.0):
        static_in.copy_(torch.full((4,), value))
        graph.replay()
        backend.synchronize()
        assert torch.equal(graph.output, torch.full((4,), value * 10, device=backend.device))


class _Holder:
    def __init__(self, buf: torch.Tensor) -> None:
        self.buf = buf


def test_buffer_replaced_after_capture_is_not_seen_and_the_old_one_is_written(backend):
    holder = _Holder(torch.zeros(4, device=backend.device))
    source = torch.ones(4, device=backend.device)

    def fn():
        holder.buf.add_(source)
        return holder.buf * 2

    graph = backend.capture(fn)
    old = holder.buf
    holder.buf = torch.full((4,), 100.0, device=backend.device)
    graph.replay()
    backend.synchronize()
    assert torch.equal(old, torch.ones(4, device=backend.device))
    assert torch.equal(holder.buf, torch.full((4,), 100.0, device=backend.device))
    assert torch.equal(graph.output, torch.full((4,), 2.0, device=backend.device))


@pytest.mark.parametrize("swap", ["data", "set_", "resize_"])
def test_storage_swapped_under_the_same_tensor_object_is_refused_at_replay(backend, swap):
    # A weight reload that does `param.data = new` keeps the Python object but moves its storage;
    # the graph still reads the capture-time address, so both backends refuse the replay (as
    # cudagraph_trees refuses a static input whose data pointer changed), naming both addresses.
    weight = torch.full((4,), 3.0, device=backend.device)
    graph = backend.capture(lambda: weight * 2)
    before = weight.data_ptr()
    old = weight.data  # keeps the old storage alive: only the tensor object moved
    new = torch.full((4,), 5.0, device=backend.device)
    if swap == "data":
        weight.data = new
    elif swap == "set_":
        weight.set_(new)
    else:
        weight.set_(old.untyped_storage(), 0, (4,))  # share the storage with `old`, then grow it
        weight.resize_(1 << 16)
    with pytest.raises(FreedMemoryError, match=f"{before:#x}.*{weight.data_ptr():#x}"):
        graph.replay()
    assert torch.equal(old[:4], torch.full((4,), 3.0, device=backend.device))


def test_host_work_on_the_cpu_runs_once_at_capture(backend):
    if backend.device.type == "cpu":
        pytest.skip("on a cpu device every op is device work")
    x = torch.ones(4, device=backend.device)

    def fn():
        scale = float(torch.arange(4).sum())  # CPU tensors: host work, frozen at capture
        return x * scale

    graph = backend.capture(fn)
    graph.replay()
    backend.synchronize()
    assert torch.equal(graph.output, torch.full((4,), 6.0, device=backend.device))


def test_branch_on_a_python_int_is_frozen(backend):
    state = {"n": 1}
    x = torch.zeros(3, device=backend.device)

    def fn():
        return x + 1 if state["n"] > 0 else x - 1

    graph = backend.capture(fn)
    state["n"] = -1
    graph.replay()
    backend.synchronize()
    assert torch.equal(graph.output, torch.ones(3, device=backend.device))


def test_python_side_effects_run_once_at_capture(backend):
    calls = []
    x = torch.zeros(3, device=backend.device)

    def fn():
        calls.append(len(calls))
        return x + len(calls)

    graph = backend.capture(fn)
    graph.replay()
    graph.replay()
    backend.synchronize()
    assert calls == [0]
    assert torch.equal(graph.output, torch.ones(3, device=backend.device))


def test_shapes_are_frozen_at_capture(backend):
    buf = torch.arange(6.0, device=backend.device)
    n = {"rows": 2}
    graph = backend.capture(lambda: buf[: n["rows"]] * 1)
    n["rows"] = 5
    graph.replay()
    backend.synchronize()
    assert graph.output.shape == (2,)
    assert torch.equal(graph.output, torch.tensor([0.0, 1.0], device=backend.device))
