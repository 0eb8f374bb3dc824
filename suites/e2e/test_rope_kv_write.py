"""The engine with rope_kv_write="fused" against "separate": greedy tokens and logprobs within the
BF16-step comparison, eager and through decode and piecewise graphs, on the session's device and
graph backend (the CPU with the emulated backend; the emulated device with --emulate-cuda; CUDA
and its Triton kernel with --graph-backend cuda)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fixtures.fused_engines import GRAPH_MODES, fused_against_separate
from fixtures.models import TINY_ENGINE_CONFIG, mixed_requests


@pytest.mark.parametrize("graphs", list(GRAPH_MODES))
def test_fused_generations_equal_the_separate_engine(device_reference_llama, graph_backend, graphs):
    config = replace(TINY_ENGINE_CONFIG, compile="none", **GRAPH_MODES[graphs])
    engine, comparison = fused_against_separate(device_reference_llama, config, "rope_kv_write",
                                                mixed_requests(seed=3),
                                                graph_backend if graphs != "eager" else None)
    assert engine.rope_kv_write.mode == "fused" and not engine.stats.fallbacks
    assert comparison.ok, str(comparison)
