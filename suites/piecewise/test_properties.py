"""Suite b: Hypothesis properties of the piecewise machinery (`property` marker; profile `ci` in
pre-merge, `nightly` in the nightly list).

- random FX graphs (chains and DAGs, dynamic ops first, last, adjacent, alone or absent) split into
  correct partitions, and their piecewise replay equals eager at every bucket;
- random token counts against random bucket sets take the smallest bucket that fits, or an eager
  route with its reason past the largest;
- random invalid bucket lists are refused naming the bad bucket;
- random engine workloads agree with eager by compare_generations in graph mode; a failing example
  shrinks to a minimal `Workload`, which Hypothesis prints and the assertion message repeats.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, example, find, given, settings
from hypothesis import strategies as st

from fixtures.models import TINY_ENGINE_CONFIG
from harness.check import compare_generations
from harness.check.strategies import Workload, bucket_sets, fx_graph_specs, invalid_bucket_lists, workloads
from harness.runtime import Engine
from harness.runtime.piecewise import runner as piecewise
from harness.runtime.piecewise.buckets import bucket_for, validate_buckets
from harness.runtime.piecewise.compile_backend import PiecewiseCompileBackend
from harness.runtime.dispatch import EAGER_ROUTE, PIECEWISE, route
from harness.runtime.piecewise.runner import CAPTURE, REPLAY, WARMUP
from harness.runtime.piecewise.split import split_graph_at_dynamic_ops
from harness.runtime.piecewise.model import bucket_key
from suites.piecewise.fx_graphs import build_fx_graph, inputs_for, is_test_dynamic
from suites.piecewise.test_split import check_partitions

pytestmark = pytest.mark.property


@given(spec=fx_graph_specs(), buckets=bucket_sets(max_bucket=8, max_size=3), packet=st.booleans())
def test_random_fx_graphs_split_correctly_and_replay_equal_to_eager(graph_backend, device, spec,
                                                                    buckets, packet):
    gm = build_fx_graph(spec, packet=packet)
    check_partitions(spec, gm, split_graph_at_dynamic_ops(gm, is_test_dynamic))

    backend = PiecewiseCompileBackend(graph_backend, split_at=is_test_dynamic)
    split = backend(gm, [])
    control = backend.control
    for mode in (WARMUP, CAPTURE, REPLAY):
        for tokens in buckets:
            control.mode, control.num_tokens = mode, tokens
            seed = tokens + (1000 if mode == REPLAY else 0)  # serving inputs differ from capture's
            actual = split(*inputs_for(tokens, seed, device))
            expected = gm(*inputs_for(tokens, seed, device))
            for a, e in zip(actual, expected):
                torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)
    control.num_tokens = None
    assert all(r.captured_buckets == buckets for r in backend.runners)
    assert all(e.replays == 2 for r in backend.runners for e in r.entries.values())  # capture + serve


@given(buckets=bucket_sets(max_bucket=512, max_size=6), num_tokens=st.integers(1, 600),
       kind=st.sampled_from(["prefill", "mixed"]))
def test_random_token_counts_take_the_smallest_bucket_that_fits(buckets, num_tokens, kind):
    chosen = route(kind, 1, num_tokens, buckets=buckets)
    fitting = [b for b in buckets if b >= num_tokens]
    if fitting:
        assert chosen.kind == PIECEWISE and chosen.size == min(fitting) == bucket_for(num_tokens, buckets)
    else:
        assert chosen.kind == EAGER_ROUTE and chosen.size is None
        assert chosen.reason == (f"{kind} batch of {num_tokens} tokens: above the largest piecewise "
                                 f"bucket {max(buckets)}")


@given(case=invalid_bucket_lists(max_num_tokens=256))
def test_random_invalid_bucket_lists_are_refused_naming_the_bucket(case):
    buckets, culprit = case
    with pytest.raises(ValueError) as raised:
        validate_buckets(buckets, max_num_tokens=256)
    assert f"piecewise bucket {culprit!r} " in str(raised.value)


# ------------------------------------------------------------------------------------------------
# Engine workloads


class EngineCache:
    """Engines by configuration: compiling and capturing costs seconds, generating milliseconds."""

    def __init__(self, model, graph_backend) -> None:
        self.model, self.graph_backend = model, graph_backend
        self._engines: dict[tuple, Engine] = {}

    def get(self, max_batch_size: int, buckets: tuple[int, ...] = (), overlap: bool = False) -> Engine:
        key = (max_batch_size, buckets, overlap)
        if key not in self._engines:
            config = replace(TINY_ENGINE_CONFIG, max_batch_size=max_batch_size, piecewise_buckets=buckets,
                             overlap=overlap)
            self._engines[key] = Engine(self.model, config, backend=self.graph_backend if buckets else None)
        return self._engines[key]


@pytest.fixture(scope="module")
def engines(device_reference_llama, graph_backend):
    return EngineCache(device_reference_llama, graph_backend)


def workload_problem(engines: EngineCache, workload: Workload, overlap: bool = False) -> str | None:
    """None when the workload in graph mode (through the overlap loop if `overlap`) agrees with
    eager without overlap and every batch went where dispatch says; else what went wrong."""
    requests = workload.make_requests()
    expected = engines.get(workload.max_batch_size).generate(requests)
    engine = engines.get(workload.max_batch_size, workload.buckets, overlap)
    start = len(engine.stats.batches)
    actual = engine.generate(requests)
    comparison = compare_generations(expected, actual)
    if not comparison.ok:
        return f"{workload}\n{comparison}"
    for batch in engine.stats.batches[start:]:
        bucket = bucket_for(batch.num_tokens, workload.buckets) if batch.kind != "decode" else None
        wanted = bucket_key(bucket) if bucket is not None else "eager"
        if batch.producer != wanted:
            return f"{workload}\n{batch.kind} batch of {batch.num_tokens} tokens ran on {batch.producer}, not {wanted}"
    if engine.piecewise.recompiles:
        return f"{workload}\n{engine.piecewise.recompiles} recompiles while serving"
    return None


# Two engine shapes only, so pre-merge compiles twice; the nightly sibling draws freely.
PRE_MERGE_WORKLOADS = workloads(max_requests=4, buckets=st.sampled_from([(16, 64), (8, 32, 128)]),
                                max_batch_sizes=st.sampled_from([2, 8]))


@settings(max_examples=6, suppress_health_check=[HealthCheck.too_slow])
@given(workload=PRE_MERGE_WORKLOADS)
# A prefill exactly on a bucket, one just past the largest, and a mixed batch one past a bucket.
@example(workload=Workload(requests=((10, 2), (6, 2)), max_batch_size=8, buckets=(16, 64)))
@example(workload=Workload(requests=((40, 1), (25, 1)), max_batch_size=8, buckets=(16, 64)))
@example(workload=Workload(requests=((3, 3), (9, 2), (16, 2)), max_batch_size=2, buckets=(16, 64)))
def test_random_workloads_agree_with_eager_in_graph_mode(engines, workload):
    problem = workload_problem(engines, workload)
    assert problem is None, problem


@pytest.mark.slow
@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads())
def test_random_workloads_with_random_buckets_agree_with_eager(engines, workload):
    problem = workload_problem(engines, workload)
    assert problem is None, problem


# The overlap loop on the same two engine shapes (one more compile each), few examples pre-merge.
@settings(max_examples=3, suppress_health_check=[HealthCheck.too_slow])
@given(workload=PRE_MERGE_WORKLOADS)
@example(workload=Workload(requests=((3, 3), (9, 2), (16, 2)), max_batch_size=2, buckets=(16, 64)))
def test_random_workloads_through_the_overlap_loop_agree_with_eager(engines, workload):
    problem = workload_problem(engines, workload, overlap=True)
    assert problem is None, problem


@pytest.mark.slow
@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads())
def test_random_workloads_with_random_buckets_agree_with_eager_through_the_overlap_loop(engines, workload):
    problem = workload_problem(engines, workload, overlap=True)
    assert problem is None, problem


def test_the_workload_check_catches_stale_static_inputs(device_reference_llama, graph_backend, monkeypatch):
    """Planted bug: serving inputs are never copied into the static buffers, so replay recomputes
    the capture batch. (A fresh engine: after an earlier batch with the same token ids the stale
    rows could differ in positions only, which RoPE's relative form hides.)"""
    monkeypatch.setattr(piecewise, "copy_into_static", lambda static, new, *, name: None)
    workload = Workload(requests=((7, 2), (12, 2)), max_batch_size=8, buckets=(16, 64))
    problem = workload_problem(EngineCache(device_reference_llama, graph_backend), workload)
    assert problem is not None and "Workload(requests=((7, 2), (12, 2))" in problem


@pytest.mark.slow
def test_a_failing_workload_shrinks_to_a_minimal_one(device_reference_llama, graph_backend, monkeypatch):
    monkeypatch.setattr(piecewise, "copy_into_static", lambda static, new, *, name: None)
    fresh = EngineCache(device_reference_llama, graph_backend)
    minimal = find(PRE_MERGE_WORKLOADS, lambda w: workload_problem(fresh, w) is not None,
                   settings=settings(max_examples=200, database=None, derandomize=True))
    assert minimal.requests == ((1, 1),) and minimal.seed == 0
