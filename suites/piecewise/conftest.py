"""Engines with piecewise graphs on the chosen graph backend's device, and their eager baselines."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fixtures.models import TINY_ENGINE_CONFIG
from harness.runtime import Engine

BUCKETS = (16, 64, 256)


@pytest.fixture
def piecewise_engine(device_reference_llama, graph_backend):
    """make(buckets=BUCKETS, **config overrides) -> an Engine with piecewise graphs captured."""

    def make(buckets=BUCKETS, **overrides) -> Engine:
        config = replace(TINY_ENGINE_CONFIG, piecewise_buckets=tuple(buckets), **overrides)
        engine = Engine(device_reference_llama, config, backend=graph_backend)
        engine.prepare_graphs()
        return engine

    return make


@pytest.fixture
def eager_run(device_reference_llama):
    """run(requests, **config overrides) -> generations of an eager engine on the same device."""

    def run(requests, **overrides):
        return Engine(device_reference_llama, replace(TINY_ENGINE_CONFIG, **overrides)).generate(requests)

    return run
