"""CUDA graph conditional nodes (CUDA 12.4's if and while nodes, torch's
`CUDAGraph.begin_capture_to_if_node` / `begin_capture_to_while_node` and torch.cond /
torch.while_loop captured through torch's own dispatch mode): the predicate is read on the device
where its set-handle kernel sits in the replay, so a body runs, or loops, as the predicate holds
at each replay, never as it held at capture. The rows run on builds whose CUDAGraph has the calls
(torch 2.13 for the if node, 2.14 for the while node); torch 2.11 has neither, and neither does
the emulated graph there."""

from __future__ import annotations

import contextlib

import pytest
import torch

from harness import torch_internals

IF_NODES = torch_internals.optional_name("cudagraph_if_else_node") is not None
WHILE_NODES = torch_internals.optional_name("cudagraph_while_loop_node") is not None
needs_if_nodes = pytest.mark.skipif(
    not IF_NODES, reason=f"torch {torch.__version__}'s CUDAGraph has no conditional nodes")
needs_while_nodes = pytest.mark.skipif(
    not WHILE_NODES, reason=f"torch {torch.__version__}'s CUDAGraph has no while nodes (< 2.14)")


def _control_flow_capture_mode():
    """torch's mode that turns torch.cond / torch.while_loop into conditional nodes while a
    graph is captured (cudagraph trees push it around their recordings)."""
    from torch._higher_order_ops.cudagraph_conditional_nodes import (
        CUDAGraphCaptureControlFlowOpDispatchMode)

    return CUDAGraphCaptureControlFlowOpDispatchMode()


@contextlib.contextmanager
def _if_node(graph, pred):
    graph.begin_capture_to_if_node(pred)
    try:
        yield
    finally:
        graph.end_capture_to_conditional_node()


@needs_if_nodes
def test_an_if_node_runs_its_body_as_the_predicate_holds_at_each_replay(cuda_kind):
    pred = torch.zeros((), device="cuda", dtype=torch.bool)
    x = torch.zeros(4, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with _if_node(graph, pred):
            x.add_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    assert x.tolist() == [0.0] * 4  # the predicate was False at this replay
    pred.fill_(True)
    graph.replay()
    graph.replay()
    pred.fill_(False)
    graph.replay()
    torch.cuda.synchronize()
    assert x.tolist() == [2.0] * 4


@needs_if_nodes
def test_a_predicate_the_graph_computes_is_read_where_the_node_begins(cuda_kind):
    x = torch.zeros(3, device="cuda")
    total = torch.zeros((), device="cuda")
    pred = torch.zeros((), device="cuda", dtype=torch.bool)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.gt(x.sum(), 0, out=pred)
        with _if_node(graph, pred):
            total.add_(x.sum())
        pred.fill_(True)  # after the node began: its handle already holds the value above
    for values in ([1.0, 2.0, 3.0], [-1.0, -2.0, 0.0], [0.5, 0.5, 0.0]):
        x.copy_(torch.tensor(values, device="cuda"))
        graph.replay()
    torch.cuda.synchronize()
    assert total.item() == 7.0


@needs_if_nodes
def test_nested_if_nodes_each_read_their_own_predicate(cuda_kind):
    outer = torch.zeros((), device="cuda", dtype=torch.bool)
    inner = torch.zeros((), device="cuda", dtype=torch.bool)
    hits = torch.zeros(2, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with _if_node(graph, outer):
            hits[0].add_(1.0)
            with _if_node(graph, inner):
                hits[1].add_(1.0)
    for o, i in ((False, True), (True, False), (True, True)):
        outer.fill_(o)
        inner.fill_(i)
        graph.replay()
    torch.cuda.synchronize()
    assert hits.tolist() == [2.0, 1.0]


@needs_while_nodes
def test_a_while_node_loops_until_the_predicate_its_body_sets_turns_false(cuda_kind):
    count = torch.zeros((), device="cuda", dtype=torch.int64)
    limit = torch.full((), 5, device="cuda", dtype=torch.int64)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pred = count < limit
        graph.begin_capture_to_while_node(pred)
        count.add_(1)
        torch.lt(count, limit, out=pred)
        graph.set_conditional_handle_for_current_node(pred)
        graph.end_capture_to_conditional_node()
    graph.replay()
    torch.cuda.synchronize()
    assert count.item() == 5
    limit.fill_(9)
    graph.replay()
    graph.replay()  # the predicate is False before the first iteration: no pass at all
    torch.cuda.synchronize()
    assert count.item() == 9


@needs_if_nodes
def test_torch_cond_under_torchs_capture_mode_takes_the_branch_of_each_replay(cuda_kind):
    x = torch.arange(4.0, device="cuda")
    pred = torch.ones((), device="cuda", dtype=torch.bool)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), _control_flow_capture_mode():
        out = torch.cond(pred, lambda t: t * 2, lambda t: t - 1, (x,))
    graph.replay()
    torch.cuda.synchronize()
    assert out.tolist() == [0.0, 2.0, 4.0, 6.0]
    pred.fill_(False)
    graph.replay()
    torch.cuda.synchronize()
    assert out.tolist() == [-1.0, 0.0, 1.0, 2.0]


@needs_while_nodes
def test_torch_while_loop_under_torchs_capture_mode_runs_as_many_times_as_each_replay_asks(
        cuda_kind):
    start = torch.zeros((), device="cuda")
    limit = torch.full((), 3.0, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), _control_flow_capture_mode():
        out, _ = torch._higher_order_ops.while_loop(
            lambda i, n: i < n, lambda i, n: (i + 1, n.clone()), (start, limit))
    graph.replay()
    torch.cuda.synchronize()
    assert out.item() == 3.0
    limit.fill_(7.0)
    graph.replay()
    torch.cuda.synchronize()
    assert out.item() == 7.0


@needs_if_nodes
def test_a_random_op_in_a_body_fails_the_node_and_the_capture(cuda_kind):
    pred = torch.ones((), device="cuda", dtype=torch.bool)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin()
        graph.begin_capture_to_if_node(pred)
        torch.rand(4, device="cuda")
        with pytest.raises(RuntimeError, match="RNG within data-dependent conditional nodes is "
                                               "not supported yet"):
            graph.end_capture_to_conditional_node()
        with pytest.raises(RuntimeError, match="RNG within data-dependent conditional nodes"):
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()


@needs_if_nodes
def test_conditional_node_calls_out_of_place_fail_in_torchs_words(cuda_kind):
    graph = torch.cuda.CUDAGraph()
    pred = torch.zeros((), device="cuda", dtype=torch.bool)
    with pytest.raises(RuntimeError, match=r"capture_begin\(\) must be called before "
                                           r"begin_capture_to_conditional_node\(\)"):
        graph.begin_capture_to_if_node(pred)
    with pytest.raises(RuntimeError, match="Missing capture ID for conditional node"):
        graph.end_capture_to_conditional_node()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin()
        with pytest.raises(RuntimeError, match="expected scalar type Bool but found Float"):
            graph.begin_capture_to_if_node(torch.zeros((), device="cuda"))
        graph.begin_capture_to_if_node(pred)
        # the body's own stream is current inside it on CUDA, not the capture's
        with pytest.raises(RuntimeError, match="Capture must end on the same stream it began on"):
            graph.capture_end()
        graph.end_capture_to_conditional_node()
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()


def test_the_emulated_graph_has_the_conditional_calls_of_this_build(cuda_device):
    graph = torch.cuda.CUDAGraph()
    assert hasattr(graph, "begin_capture_to_if_node") == IF_NODES
    assert hasattr(graph, "end_capture_to_conditional_node") == IF_NODES
    assert hasattr(graph, "begin_capture_to_while_node") == WHILE_NODES
    assert hasattr(graph, "set_conditional_handle_for_current_node") == WHILE_NODES


def test_a_users_dispatch_mode_sees_the_device_in_a_higher_order_operator(cuda_kind):
    # torch's Python dispatcher hands torch.cond to the mode on top with the mode popped for the
    # call; torch's capture mode (above) asks pred.is_cuda there
    seen = []

    class SeesCond(torch.utils._python_dispatch.TorchDispatchMode):
        supports_higher_order_operators = True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.higher_order.cond:
                seen.append(args[0].is_cuda)
            return func(*args, **(kwargs or {}))

    pred = torch.ones((), device="cuda", dtype=torch.bool)
    x = torch.arange(3.0, device="cuda")
    with SeesCond():
        out = torch.cond(pred, lambda t: t + 1, lambda t: t - 1, (x,))
    assert seen == [True]
    assert out.tolist() == [1.0, 2.0, 3.0]
