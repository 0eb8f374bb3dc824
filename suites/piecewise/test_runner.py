"""PiecewiseRunner and the compile backend on small FX graphs: warmup, capture, replay per bucket;
inputs copied into static buffers; wrong shapes, missing captures and released pools are errors
(or a counted fallback), never silent."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from harness.runtime.piecewise import runner as piecewise
from harness.runtime.piecewise import split
from harness.runtime.piecewise.compile_backend import PiecewiseCompileBackend
from harness.runtime.piecewise.runner import (CAPTURE, REPLAY, WARMUP, MissingCaptureError, ReleasedPoolError,
                                              ReplayInputError)
from suites.piecewise.conftest import FirstPoolAgain
from suites.piecewise.fx_graphs import build_fx_graph, inputs_for, is_test_dynamic
from suites.piecewise.test_split import chain

SPEC = chain("linear", "dynamic", "relu", "add", "dynamic", "tanh")


def compiled(graph_backend, spec=SPEC, **options):
    backend = PiecewiseCompileBackend(graph_backend, split_at=is_test_dynamic, **options)
    gm = build_fx_graph(spec)
    return backend, backend(gm, []), gm


def run(backend, split, mode, tokens, seed, device):
    backend.control.mode, backend.control.num_tokens = mode, tokens
    try:
        return split(*inputs_for(tokens, seed, device))
    finally:
        backend.control.mode, backend.control.num_tokens = REPLAY, None


def capture(backend, split, buckets, device):
    for mode in (WARMUP, CAPTURE):
        for tokens in buckets:
            run(backend, split, mode, tokens, seed=100 + tokens, device=device)


def assert_equal(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)


def test_replay_equals_eager_for_every_bucket_with_new_inputs(graph_backend, device):
    backend, split, gm = compiled(graph_backend)
    capture(backend, split, (4, 8), device)
    assert [r.captured_buckets for r in backend.runners] == [(4, 8)] * 3
    for tokens in (8, 4, 8):
        actual = run(backend, split, REPLAY, tokens, seed=tokens * 3, device=device)
        assert_equal(actual, gm(*inputs_for(tokens, seed=tokens * 3, device=device)))
    assert all(r.entries[8].replays == 3 and r.entries[4].replays == 2 for r in backend.runners)


def test_every_non_weight_input_is_copied_and_weights_are_not(graph_backend, device):
    backend, split, _ = compiled(graph_backend)
    capture(backend, split, (4,), device)
    first = backend.runners[0]  # linear(y): inputs y and w
    entry = first.entries[4]
    names = [n.target for n in first.module.graph.nodes if n.op == "placeholder"]
    assert [names[i] for i in entry.copied] == ["y"]
    assert entry.static_inputs[names.index("w")] is inputs_for(4, 0, device)[2]


def test_skipping_the_input_copy_replays_stale_inputs(graph_backend, device, monkeypatch):
    """Planted bug: serving inputs never reach the static buffers; replay recomputes the capture batch."""
    backend, split, gm = compiled(graph_backend)
    capture(backend, split, (4,), device)
    monkeypatch.setattr(piecewise, "copy_into_static", lambda static, new, *, name: None)
    actual = run(backend, split, REPLAY, 4, seed=5, device=device)
    assert not torch.allclose(actual[0], gm(*inputs_for(4, 5, device))[0])


def test_a_replay_input_of_the_wrong_shape_names_it(graph_backend, device):
    backend, split, _ = compiled(graph_backend)
    capture(backend, split, (4,), device)
    backend.control.mode, backend.control.num_tokens = REPLAY, 4  # announced 4, passes 6 rows
    with pytest.raises(ReplayInputError, match=r"segment 0 input 0 \(y\): captured as \(4, 4\) "
                                               r"torch.float32, replayed with \(6, 4\)"):
        split(*inputs_for(6, 0, device))


def test_a_missing_capture_raises_naming_the_bucket(graph_backend, device):
    backend, split, _ = compiled(graph_backend)
    capture(backend, split, (4,), device)
    with pytest.raises(MissingCaptureError, match=r"no graph for tokens=8 \(captured: \[4\]\)"):
        run(backend, split, REPLAY, 8, seed=0, device=device)


def test_a_missing_capture_falls_back_eagerly_only_when_counted(graph_backend, device):
    reasons = Counter()
    backend, split, gm = compiled(graph_backend, on_missing=lambda reason: reasons.update([reason]))
    capture(backend, split, (4,), device)
    actual = run(backend, split, REPLAY, 8, seed=2, device=device)
    assert_equal(actual, gm(*inputs_for(8, 2, device)))
    assert sum(reasons.values()) == 3 and all("tokens=8" in r for r in reasons)


def test_clear_resets_every_runner_and_recapture_uses_fresh_pools(graph_backend, device):
    backend, split, gm = compiled(graph_backend)
    capture(backend, split, (4, 8), device)
    old_pools = [g.pool for g in backend.groups]
    backend.clear_piecewise_graphs()
    assert all(r.entries == {} for r in backend.runners)
    with pytest.raises(MissingCaptureError):
        run(backend, split, REPLAY, 4, seed=0, device=device)
    capture(backend, split, (4, 8), device)
    assert not any(piecewise.same_pool(g.pool, old) for g in backend.groups for old in old_pools)
    assert_equal(run(backend, split, REPLAY, 8, seed=9, device=device), gm(*inputs_for(8, 9, device)))


def test_a_recapture_into_a_released_pool_is_refused(graph_backend, device):
    """Planted bug: the pool factory hands the released pool back."""
    backend, split, _ = compiled(graph_backend, pools=FirstPoolAgain())
    capture(backend, split, (4,), device)
    backend.clear_piecewise_graphs()
    run(backend, split, WARMUP, 4, seed=0, device=device)
    with pytest.raises(ReleasedPoolError, match="which clear_piecewise_graphs\\(\\) released"):
        run(backend, split, CAPTURE, 4, seed=0, device=device)


def test_capturing_a_bucket_twice_is_refused(graph_backend, device):
    backend, split, _ = compiled(graph_backend)
    capture(backend, split, (4,), device)
    with pytest.raises(RuntimeError, match="tokens=4 is captured already"):
        run(backend, split, CAPTURE, 4, seed=0, device=device)


def test_a_call_outside_a_bucket_context_is_refused(graph_backend, device):
    backend, split, _ = compiled(graph_backend)
    with pytest.raises(RuntimeError, match="without a token bucket"):
        split(*inputs_for(4, 0, device))


def test_static_outputs_are_overwritten_by_the_next_replay(graph_backend, device):
    """Outputs live in the graph's pool: a caller who keeps one across replays sees it change, so
    the engine copies what it keeps (the logits rows) right away."""
    backend, split, _ = compiled(graph_backend)
    capture(backend, split, (4,), device)
    first = run(backend, split, REPLAY, 4, seed=1, device=device)[0]
    kept = first.clone()
    run(backend, split, REPLAY, 4, seed=2, device=device)
    assert not torch.equal(first, kept)


def test_a_static_piece_that_writes_its_input_is_refused(graph_backend):
    """A static piece writing an input in place would write the runner's static copy on replay:
    the caller's tensor (a KV cache, say) would silently miss the write."""
    from torch import fx

    graph = fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    view = graph.call_method("view", (y, -1))
    graph.call_method("add_", (view, 1.0))
    graph.output(graph.call_function(torch.relu, (x,)))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    backend = PiecewiseCompileBackend(graph_backend, split_at=is_test_dynamic)
    with pytest.raises(ValueError, match=r"static piece submod_0 writes its inputs \['y'\] in place"):
        backend(gm, [])


def test_writes_through_schemas_and_out_are_seen():
    from torch import fx

    graph = fx.Graph()
    a, b, c, d = (graph.placeholder(n) for n in "abcd")
    graph.call_function(torch.ops.aten.index_copy_.default, (a, 0, b, c))
    graph.call_function(torch.add, (c, c), {"out": d})
    graph.call_function(torch.mul, (b, 2.0))
    graph.output(None)
    assert split.mutated_inputs(fx.GraphModule(torch.nn.Module(), graph)) == ["a", "d"]


def captured_scaling_runner(graph_backend, device):
    """A runner over `x * w * scale` (w a Parameter, scale a host int), warmed up and captured for 4
    tokens with scale 2."""
    from harness.runtime.piecewise.runner import CaptureControl, PiecewiseRunner, PoolGroup

    control = CaptureControl()
    runner = PiecewiseRunner(lambda x, w, scale: x * w * scale, index=0, backend=graph_backend,
                             control=control, group=PoolGroup(pool=graph_backend.graph_pool_handle()))
    weight = torch.nn.Parameter(torch.ones(4, device=device), requires_grad=False)
    x = torch.arange(4.0, device=device)
    control.num_tokens = 4
    for mode in (WARMUP, CAPTURE):
        control.mode = mode
        runner(x, weight, 2)
    control.mode = REPLAY
    return runner, x, weight


def test_a_weight_replaced_after_capture_is_an_error_naming_it(graph_backend, device):
    runner, x, weight = captured_scaling_runner(graph_backend, device)
    assert torch.equal(runner(x, weight, 2), x * 2)
    replaced = torch.nn.Parameter(weight.detach() * 5, requires_grad=False)
    with pytest.raises(ReplayInputError, match=r"piecewise segment 0 input 1 \(#1\): a static input "
                                               r"\(a weight or an earlier segment's output\) was "
                                               r"replaced after capture"):
        runner(x, replaced, 2)


def test_a_host_value_other_than_captured_is_an_error_naming_both(graph_backend, device):
    runner, x, weight = captured_scaling_runner(graph_backend, device)
    with pytest.raises(ReplayInputError, match=r"piecewise segment 0 input 2 \(#2\): host value 3 differs "
                                               r"from 2 frozen at capture"):
        runner(x, weight, 3)
