"""torch.cuda.CUDAGraph on the emulated CUDA device is this torch build's own Python class over
the emulated C++ half: what that Python half does (torch 2.14's hooks, destroy callbacks, retained
objects, pool handles, the instantiate-on-first-replay rule and the template of `raw_cuda_graph()`)
happens as on CUDA. The rows for those APIs run on builds that have them (the CUDA wheels 2.14.1
and 2.15.0); on a build without them there is nothing of theirs to check."""

from __future__ import annotations

import gc
import weakref
from unittest import mock

import pytest
import torch
import torch.cuda.graphs

# Module functions of the same torch change as the per-graph hooks; the emulation replaces
# torch.cuda.graphs.CUDAGraph but never these, so this asks the build itself.
HOOKS = hasattr(torch.cuda.graphs, "register_graph_capture_end_hook")
needs_hooks = pytest.mark.skipif(not HOOKS, reason="this torch's CUDAGraph has no hooks (< 2.14)")


def _captured(keep_graph: bool = False):
    x = torch.zeros(8, device="cuda")
    g = torch.cuda.CUDAGraph(keep_graph=keep_graph)
    with torch.cuda.graph(g):
        y = x + 1
    return g, x, y


@needs_hooks
def test_capture_end_and_instantiate_hooks_fire_in_order(cuda_kind):
    order, instantiated = [], []
    g = torch.cuda.CUDAGraph(keep_graph=True)
    g.register_capture_end_hook(lambda _g: order.append("a"))
    g.register_capture_end_hook(lambda _g: order.append("b")).remove()
    g.register_capture_end_hook(lambda _g: order.append("c"))
    x = torch.zeros(8, device="cuda")
    with torch.cuda.graph(g):
        x + 1
    assert order == ["a", "c"]
    g.register_post_instantiate_hook(lambda _g: instantiated.append(1))
    g.instantiate()
    g.instantiate()
    assert len(instantiated) == 2


@needs_hooks
def test_replay_hooks_bracket_each_replay_and_the_global_ones_see_every_graph(cuda_kind):
    events = []
    g, x, y = _captured()
    g.register_replay_start_hook(lambda _g: events.append("start"))
    g.register_replay_end_hook(lambda _g: events.append("end"))
    handle = torch.cuda.graphs.register_graph_replay_start_hook(
        lambda graph: events.append("global" if graph is g else "other"))
    try:
        g.replay()
    finally:
        handle.remove()
    torch.cuda.synchronize()
    assert events == ["global", "start", "end"]
    assert y.sum().item() == 8


def test_a_patch_of_the_cpp_half_reaches_every_graph(cuda_kind):
    # torch._C._CUDAGraph is the class under torch.cuda.CUDAGraph on every build; PyTorch's
    # test_graph_replay_hooks makes its replay raise to see the end hooks fire anyway
    g, x, y = _captured()
    assert isinstance(g, torch._C._CUDAGraph)
    with mock.patch.object(torch._C._CUDAGraph, "replay", side_effect=RuntimeError("boom")):
        with pytest.raises(RuntimeError, match="boom"):
            g.replay()
    g.replay()
    torch.cuda.synchronize()
    assert y.sum().item() == 8


@needs_hooks
def test_replay_end_hooks_fire_when_the_launch_raises(cuda_kind):
    events = []
    g, x, y = _captured()
    g.register_replay_start_hook(lambda _g: events.append("start"))
    g.register_replay_end_hook(lambda _g: events.append("end"))
    with mock.patch.object(torch._C._CUDAGraph, "replay", side_effect=RuntimeError("boom")):
        with pytest.raises(RuntimeError, match="boom"):
            g.replay()
    assert events == ["start", "end"]


@needs_hooks
def test_destroy_callbacks_fire_once_on_reset_and_on_destruction(cuda_kind):
    calls = []
    g, _, _ = _captured()
    g.register_destroy_callback(lambda: calls.append("reset"))
    g.reset()
    assert calls == ["reset"]
    g, _, _ = _captured()

    class Held:
        pass

    held = Held()
    ref = weakref.ref(held)
    g.retain_object(held)
    g.register_destroy_callback(lambda: calls.append("destroyed"))
    del held
    gc.collect()
    assert ref() is not None
    del g
    gc.collect()
    assert calls == ["reset", "destroyed"]
    assert ref() is None


@needs_hooks
def test_a_keep_graph_false_template_is_gone_after_capture_but_seen_by_a_capture_end_hook(
        cuda_kind):
    seen = []

    def hook(graph):
        try:
            seen.append(graph.raw_cuda_graph() != 0)
        except NotImplementedError:
            seen.append("refused by name")  # the emulated device has no cudaGraph_t to give

    g = torch.cuda.CUDAGraph()
    g.register_capture_end_hook(hook)
    x = torch.zeros(8, device="cuda")
    with torch.cuda.graph(g):
        x + 1
    assert seen == ([True] if cuda_kind == "native" else ["refused by name"])
    with pytest.raises(RuntimeError, match=r"^No cudaGraph_t is available"):
        g.raw_cuda_graph()
    with pytest.raises(RuntimeError, match="only when keep_graph=true"):
        g.instantiate()


@needs_hooks
def test_a_keep_graph_true_graph_is_instantiated_by_its_first_replay(cuda_kind):
    instantiated = []
    g, _, y = _captured(keep_graph=True)
    g.register_post_instantiate_hook(lambda _g: instantiated.append(1))
    g.replay()
    g.replay()
    torch.cuda.synchronize()
    assert instantiated == [1]
    assert y.sum().item() == 8


def test_the_graph_class_is_torchs_own(cuda_kind):
    # Code that checks the class (or subclasses it) sees the build's torch.cuda.graphs.CUDAGraph.
    g, _, y = _captured()
    assert type(g).__module__ == "torch.cuda.graphs"
    assert type(g).__name__ == "CUDAGraph"
    g.replay()
    torch.cuda.synchronize()
    assert y.sum().item() == 8
