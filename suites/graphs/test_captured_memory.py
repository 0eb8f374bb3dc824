"""What the cuda backend's capture notes of the memory it meets (captured_memory.py), checked on
CPU tensors: the mode itself runs on any device, only the capture around it needs CUDA."""

from __future__ import annotations

import pytest
import torch

from harness.graphs.captured_memory import CapturedMemory, PoolStorage, register_allocations


def test_inputs_are_noted_once_with_their_first_use_and_outputs_as_allocations():
    x, y = torch.ones(4), torch.full((4,), 2.0)
    with CapturedMemory(None, {}) as memory:
        z = x + y  # the first use of x and y
        w = z * x
    noted = {entry.description: entry for entry in memory.tensors.frozen()}
    assert len(memory.tensors.frozen()) == 2  # x and y; z was allocated by the capture
    assert all("z = x + y  # the first use of x and y" in str(e.first_use) for e in noted.values())
    descriptions = [str(note) for _, _, note in memory.allocated]
    assert len(descriptions) == 2
    assert descriptions[0].startswith("shape (4,), torch.float32, allocated at ")
    assert "z = x + y" in descriptions[0] and "w = z * x" in descriptions[1]
    assert w.tolist() == [3.0] * 4 and memory.failed is None


def test_ops_that_return_no_tensor_pass_through():
    x = torch.ones(4)
    with CapturedMemory(None, {}) as memory:
        assert x.sum().item() == 4.0  # a Python scalar
        torch.ops.aten._assert_async.msg(torch.tensor(True), "never raised")  # None
    assert memory.failed is None and any(note.shape == () for _, _, note in memory.allocated)


def test_the_op_that_raised_is_named_until_a_later_op_runs():
    x = torch.ones(4)
    with CapturedMemory(None, {}) as memory:
        with pytest.raises(RuntimeError):
            x.view(2, 3)  # a view: no kernel, raised before dispatch of any op
        with pytest.raises(RuntimeError):
            torch.mm(x, x)  # 1-D operands: aten.mm raises
        assert memory.failed == "aten.mm.default"
        x.add(1)
        assert memory.failed is None


def test_memory_another_pool_allocated_is_a_foreign_read_once():
    with CapturedMemory("pool A", {}) as first:
        shared = torch.zeros(3) + 1
    known: dict[int, PoolStorage] = {}
    register_allocations(known, first, "pool A")
    assert len(known) == 1
    with CapturedMemory("pool B", known) as second:
        shared.add_(1)
        shared.mul_(2)
    assert len(second.foreign) == 1
    read = second.foreign[0]
    assert read.owner.pool == "pool A" and "shared.add_(1)" in str(read.first_use)
    assert "shared = torch.zeros(3) + 1" in str(read.owner.description)
    with CapturedMemory("pool A", known) as same_pool:
        shared.add_(1)
    assert same_pool.foreign == []  # one pool: CUDA's shared-pool rules allow it


def test_a_seen_tensor_moved_onto_another_pools_memory_is_a_foreign_read():
    with CapturedMemory("pool A", {}) as first:
        shared = torch.zeros(3) + 1
    known: dict[int, PoolStorage] = {}
    register_allocations(known, first, "pool A")
    local = torch.ones(3)
    with CapturedMemory("pool B", known) as second:
        local.add_(1)  # met first on memory of its own
        local.data = shared  # no op: the same object now shows pool A's memory
        local.mul_(2)
    assert len(second.foreign) == 1 and "local.mul_(2)" in str(second.foreign[0].first_use)


class _Doubled(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2  # the model line an allocation names


def test_an_allocation_in_fx_generated_code_names_the_model_line():
    traced: list[torch.fx.GraphModule] = []

    def keep(gm, example_inputs):
        traced.append(gm)
        return gm

    torch.compile(_Doubled(), backend=keep, dynamic=False)(torch.ones(3))
    graph_module, x = traced[0], torch.ones(3)
    with CapturedMemory(None, {}) as memory:
        graph_module(x)
    notes = [str(note) for _, _, note in memory.allocated]
    assert notes and all("return x * 2  # the model line an allocation names" in n for n in notes), notes
