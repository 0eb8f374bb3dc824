"""Pointer snapshots: every reachable tensor by path, and what moved between two snapshots."""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from harness.check import moved_tensors, snapshot_tensors
from harness.graphs.pointers import (TensorRecord, describe_moved, describe_moved_tensor, public_tensor_refs,
                                     tensor_refs)


@dataclass
class Metadata:
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    extra: dict = field(default_factory=dict)
    parent: object = None


class Slotted:
    __slots__ = ("cache", "__hidden", "unset")

    def __init__(self, cache):
        self.cache = cache
        self.__hidden = torch.ones(2)


class SlottedChild(Slotted):
    __slots__ = ("more",)

    def __init__(self, cache):
        super().__init__(cache)
        self.more = torch.zeros(1)


class Holder:
    def __init__(self, **kw):
        self.__dict__.update(kw)


Pair = namedtuple("Pair", "left right")


def _metadata():
    md = Metadata(block_tables=torch.zeros(4, 8, dtype=torch.int32), seq_lens=torch.zeros(4, dtype=torch.int32))
    md.extra["ws"] = torch.empty(16)
    return md


def test_nested_objects_give_readable_paths():
    md = _metadata()
    state = Holder(metadata=md, layers=[Slotted(torch.zeros(3)), SlottedChild(torch.zeros(5))],
                   pair=Pair(torch.zeros(1), None), count=3, name="x")
    snap = snapshot_tensors(state)
    assert set(snap) == {
        "metadata.block_tables", "metadata.seq_lens", "metadata.extra['ws']",
        "layers[0].cache", "layers[0].__hidden", "layers[1].cache", "layers[1].__hidden", "layers[1].more",
        "pair.left",
    }
    assert snap["metadata.block_tables"] == TensorRecord(md.block_tables.data_ptr(), (4, 8), "torch.int32")


def test_root_prefix_and_bare_containers():
    t = torch.zeros(2)
    assert set(snapshot_tensors({"a": [t, (t,)]}, root="md")) == {"md['a'][0]", "md['a'][1][0]"}
    assert set(snapshot_tensors(t, root="x")) == {"x"}


def test_modules_record_parameters_buffers_and_plain_attributes_by_name():
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Linear(2, 2, bias=False), nn.Linear(2, 2)])
    model.register_buffer("rope", torch.zeros(4))
    model.layers[0].cache = torch.zeros(3)  # not registered: lives in __dict__, a graph still bakes it
    snap = snapshot_tensors(model)
    assert set(snap) == {"rope", "layers[0].weight", "layers[0].cache", "layers[1].weight", "layers[1].bias"}


def test_cycles_terminate_and_shared_tensors_are_recorded_under_every_path():
    md = _metadata()
    md.parent = md
    other = Holder(a=md, b=md)
    snap = snapshot_tensors(other)
    assert "a.block_tables" in snap and "b.block_tables" in snap
    assert not any("parent" in path for path in snap)


def test_in_place_copy_keeps_the_address():
    md = _metadata()
    before = snapshot_tensors(md)
    md.block_tables.copy_(torch.arange(32, dtype=torch.int32).view(4, 8))
    md.seq_lens[:2] = 7
    md.extra["ws"].fill_(1.0)
    assert moved_tensors(before, snapshot_tensors(md)) == []


def test_rebinding_is_reported():
    md = _metadata()
    before = snapshot_tensors(md)
    md.block_tables = md.block_tables.clone()
    assert moved_tensors(before, snapshot_tensors(md)) == ["block_tables"]


def test_rebinding_to_another_view_of_the_same_storage_is_reported():
    buffer = torch.zeros(16)
    holder = Holder(positions=buffer[:8])
    before = snapshot_tensors(holder)
    holder.positions = buffer[8:]  # same storage and shape, but the graph reads the first half
    assert moved_tensors(before, snapshot_tensors(holder)) == ["positions"]
    holder.positions = buffer[:8]  # a fresh view object of the captured memory is no move
    assert moved_tensors(before, snapshot_tensors(holder)) == []


def test_regrowth_beyond_storage_is_reported():
    md = _metadata()
    before = snapshot_tensors(md)
    md.extra["ws"].resize_(1 << 16)  # larger than its storage: a reallocation under the same object
    assert moved_tensors(before, snapshot_tensors(md)) == ["extra['ws']"]


def test_shape_change_within_storage_is_reported():
    md = _metadata()
    before = snapshot_tensors(md)
    md.seq_lens.resize_(2)
    after = snapshot_tensors(md)
    assert after["seq_lens"].address == before["seq_lens"].address
    assert moved_tensors(before, after) == ["seq_lens"]


def test_dtype_change_and_vanished_attribute_are_reported():
    md = _metadata()
    before = snapshot_tensors(md)
    md.seq_lens = md.seq_lens.view(torch.float32)  # same bytes, other dtype
    del md.extra["ws"]
    after = snapshot_tensors(md)
    assert after["seq_lens"].address == before["seq_lens"].address
    assert moved_tensors(before, after) == ["seq_lens", "extra['ws']"]


def test_new_paths_are_not_moves():
    md = _metadata()
    before = snapshot_tensors(md)
    md.extra["new"] = torch.zeros(1)
    assert moved_tensors(before, snapshot_tensors(md)) == []


def test_description_names_path_old_and_new_and_the_remedy():
    md = _metadata()
    before = snapshot_tensors(md, root="metadata")
    md.block_tables = torch.zeros(4, 16, dtype=torch.int32)
    after = snapshot_tensors(md, root="metadata")
    text = describe_moved_tensor("metadata.block_tables", before["metadata.block_tables"],
                                 after["metadata.block_tables"])
    assert text.startswith("metadata.block_tables: data pointer changed from ")
    assert f"{before['metadata.block_tables'].address:#x}" in text
    assert f"{after['metadata.block_tables'].address:#x}" in text
    assert "shape changed from [4, 8] to [4, 16]" in text
    assert "`.copy_()` instead of rebinding" in text
    assert "vanished" in describe_moved_tensor("x", before["metadata.seq_lens"], None)
    assert describe_moved(before, after).count("\n") == 0  # one moved tensor, one line


def test_the_public_walk_skips_a_too_deep_path_and_private_attributes_and_walks_the_rest():
    class Node:
        def __init__(self, prev) -> None:
            self.prev, self.value = prev, torch.zeros(1)

    chain = None
    for _ in range(10):
        chain = Node(chain)
    holder = SimpleNamespace(chain=chain, x=torch.ones(2), _machinery=torch.ones(3))
    walk = public_tensor_refs(holder, "h", max_depth=5)
    assert walk.too_deep == ("h.chain" + ".prev" * 4,)
    assert set(walk.refs) == {"h.x", *("h.chain" + ".prev" * i + ".value" for i in range(4))}
    assert set(tensor_refs(holder, "h", max_depth=5)) == {*walk.refs, "h._machinery"}


@pytest.mark.gpu
def test_cuda_tensors_are_recorded_and_regrowth_reported():
    md = Metadata(block_tables=torch.zeros(4, 8, dtype=torch.int32, device="cuda"),
                  seq_lens=torch.zeros(4, dtype=torch.int32, device="cuda"))
    md.extra["ws"] = torch.empty(16, device="cuda")
    before = snapshot_tensors(md)
    md.block_tables.copy_(torch.ones(4, 8, dtype=torch.int32, device="cuda"))
    md.extra["ws"] = torch.empty(1 << 20, device="cuda")
    assert moved_tensors(before, snapshot_tensors(md)) == ["extra['ws']"]


class _GraphedRuntime:
    """A correct runtime holding its torch.cuda.CUDAGraph and its static buffers."""

    def __init__(self) -> None:
        self.static_in = torch.zeros(4, device="cuda")
        self._workspace = torch.zeros(4, device="cuda")  # a runtime's own private state is walked
        self.graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph):
            self._workspace.copy_(self.static_in * 2)


def test_snapshot_of_a_runtime_holding_a_cuda_graph_walks_only_public_state():
    import contextlib

    import harness
    from harness.emulation import emulation_active

    # The emulated CUDA device, or the graph sanitizer on a GPU (the session's own under --emulate-cuda).
    with harness.emulate_cuda() if emulation_active() is None else contextlib.nullcontext():
        runtime = _GraphedRuntime()
        before = snapshot_tensors(runtime, "runtime")
        runtime.static_in.copy_(torch.ones(4, device="cuda"))
        after = snapshot_tensors(runtime, "runtime")
        assert moved_tensors(before, after) == []
        assert set(before) == {"runtime.static_in", "runtime._workspace"}
        assert before.paths_not_walked and all(p.startswith("runtime.graph._") for p in before.paths_not_walked)
        runtime._workspace = torch.zeros(8, device="cuda")
        assert moved_tensors(before, snapshot_tensors(runtime, "runtime")) == ["runtime._workspace"]


def test_a_structure_nested_too_deep_is_listed_not_raised():
    chain: dict = {"t": torch.zeros(1)}
    for _ in range(10):
        chain = {"next": chain}
    snapshot = snapshot_tensors(chain, "c", max_depth=4)
    assert dict(snapshot) == {}
    assert snapshot.paths_not_walked == ("c['next']['next']['next']['next']",)
