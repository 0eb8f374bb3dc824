"""split_graph_at_dynamic_ops: each dynamic op alone, static runs maximal, node order kept, for every
position of the dynamic ops; and the split predicate matches the op however dynamo spells it."""

from __future__ import annotations

import pytest
import torch
from torch import fx

from harness.check.strategies import FxGraphSpec, FxNodeSpec
from harness.runtime.piecewise.policy import default_piecewise_policy
from harness.runtime.piecewise.split import SplitInfo, op_name, split_graph_at_dynamic_ops
from suites.piecewise.fx_graphs import build_fx_graph, dynamic_op, inputs_for, is_test_dynamic


def call_targets(gm: fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")]


def check_partitions(spec: FxGraphSpec, gm: fx.GraphModule, info: SplitInfo) -> None:
    """The partition properties every split must have; raises AssertionError naming the broken one."""
    order = info.order
    assert order == tuple(range(len(order))), f"partitions {order} are not consecutive"
    assert len(info.dynamic) == len(spec.dynamic_positions), "one partition per dynamic op"
    for index in info.dynamic:
        calls = call_targets(info.submodule(index))
        assert len(calls) == 1 and "piecewise_test.dynamic" in calls[0], \
            f"dynamic partition {index} holds {calls}"
    for a, b in zip(order, order[1:]):
        assert not (a in info.static and b in info.static), f"static partitions {a} and {b} are adjacent"
    for index in info.static:
        assert not any("piecewise_test.dynamic" in t for t in call_targets(info.submodule(index)))
    flattened = [t for index in order for t in call_targets(info.submodule(index))]
    assert flattened == call_targets(gm), "node order changed by the split"


def chain(*kinds: str) -> FxGraphSpec:
    return FxGraphSpec(tuple(FxNodeSpec(k, (i + 1,) if k != "add" else (i + 1, 0))
                             for i, k in enumerate(kinds)))


LAYOUTS = {
    "first": (chain("dynamic", "relu", "add"), (0,), (1,)),
    "last": (chain("relu", "add", "dynamic"), (1,), (0,)),
    "adjacent": (chain("relu", "dynamic", "dynamic", "tanh"), (1, 2), (0, 3)),
    "only": (chain("dynamic"), (0,), ()),
    "none": (chain("relu", "add", "tanh"), (), (0,)),
    "alternating": (chain("dynamic", "relu", "dynamic", "linear", "dynamic"), (0, 2, 4), (1, 3)),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_partitions_for_every_position_of_the_dynamic_ops(layout):
    spec, dynamic, static = LAYOUTS[layout]
    gm = build_fx_graph(spec)
    info = split_graph_at_dynamic_ops(gm, is_test_dynamic)
    assert (info.dynamic, info.static) == (dynamic, static)
    check_partitions(spec, gm, info)
    x, y, w = inputs_for(5, seed=1)
    for a, b in zip(info.split_module(x, y, w), gm(x, y, w)):
        assert torch.equal(a, b)


def test_the_partition_check_fails_on_a_split_that_merges_a_dynamic_op():
    """A predicate that misses the op puts it into a static partition; the check says so."""
    spec = chain("relu", "dynamic", "tanh")
    gm = build_fx_graph(spec)
    wrong = split_graph_at_dynamic_ops(gm, lambda node: False)
    with pytest.raises(AssertionError, match="one partition per dynamic op"):
        check_partitions(spec, gm, wrong)


@pytest.mark.parametrize("packet", [False, True], ids=["default", "packet"])
def test_the_dynamic_op_is_matched_as_overload_or_packet(packet):
    gm = build_fx_graph(chain("relu", "dynamic", "tanh"), packet=packet)
    info = split_graph_at_dynamic_ops(gm, is_test_dynamic)
    assert info.dynamic == (1,)


def test_op_names_of_every_spelling():
    assert op_name(torch.ops.harness.paged_attention) == "harness::paged_attention"
    assert op_name(torch.ops.harness.paged_attention.default) == "harness::paged_attention"
    assert op_name(dynamic_op) == "piecewise_test::dynamic"
    assert op_name(torch.add) is None and op_name("tanh") is None


def test_the_engine_predicate_splits_at_both_attention_ops():
    split_at = default_piecewise_policy().split_at  # what an engine's piecewise backend splits with
    graph = fx.Graph()
    q = graph.placeholder("q")
    for target in (torch.ops.harness.paged_attention.default, torch.ops.harness.block_sparse_attention,
                   torch.relu):
        graph.call_function(target, (q,))
    *attention, relu = [n for n in graph.nodes if n.op == "call_function"]
    kept_static = [str(n.target) for n in attention if not split_at(n)]
    assert not kept_static, (f"the engine's split predicate keeps {kept_static} inside a static segment: "
                             f"a graph would freeze their metadata at capture")
    assert not split_at(relu), "the engine's split predicate cuts at torch.relu, a static op"


def test_a_graph_without_computing_nodes_has_no_partitions():
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(x)
    info = split_graph_at_dynamic_ops(fx.GraphModule(torch.nn.Module(), graph), is_test_dynamic)
    assert info.order == ()
    assert torch.equal(info.split_module(torch.ones(2)), torch.ones(2))
