"""The engine with decode_linear="fused" against "separate": greedy tokens and logprobs within the
BF16-step comparison, eager and through decode and piecewise graphs, on the session's device and
graph backend (the CPU with the emulated backend; the emulated device with --emulate-cuda; CUDA
and its Triton GEMV kernels with --graph-backend cuda)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fixtures.models import TINY_ENGINE_CONFIG, mixed_requests
from harness.check import compare_generations
from harness.runtime import Engine

GRAPHS = {"eager": dict(), "decode-graphs": dict(decode_graph_sizes=(1, 2, 4, 8)),
          "piecewise": dict(piecewise_buckets=(64, 256))}


@pytest.mark.parametrize("graphs", list(GRAPHS))
def test_fused_generations_equal_the_separate_engine(device_reference_llama, graph_backend, graphs):
    requests = mixed_requests(seed=3)
    config = replace(TINY_ENGINE_CONFIG, compile="none", **GRAPHS[graphs])
    backend = graph_backend if graphs != "eager" else None
    baseline = Engine(device_reference_llama, replace(config, decode_linear="separate"),
                      backend=backend).generate(requests)
    engine = Engine(device_reference_llama, replace(config, decode_linear="fused"), backend=backend)
    candidate = engine.generate(requests)
    assert engine.decode_linear.mode == "fused" and not engine.stats.fallbacks
    comparison = compare_generations(baseline, candidate)
    assert comparison.ok, str(comparison)
