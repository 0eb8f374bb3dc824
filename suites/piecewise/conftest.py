"""Engines with piecewise graphs on the chosen graph backend's device, and their eager baselines."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from fixtures.models import TINY_ENGINE_CONFIG
from harness.runtime import Engine
from harness.runtime.piecewise.policy import PoolFactory

BUCKETS = (16, 64, 256)


@dataclass(frozen=True)
class FirstPoolAgain(PoolFactory):
    """Planted bug: the pool factory hands its first pool out again at every later request."""

    first: list = field(default_factory=list)

    def new_pool(self, graph_backend):
        if not self.first:
            self.first.append(graph_backend.graph_pool_handle())
        return self.first[0]


@pytest.fixture
def piecewise_engine(device_reference_llama, graph_backend):
    """make(buckets=BUCKETS, piecewise_policy=None, **config overrides) -> an Engine with piecewise
    graphs captured."""

    def make(buckets=BUCKETS, piecewise_policy=None, **overrides) -> Engine:
        config = replace(TINY_ENGINE_CONFIG, piecewise_buckets=tuple(buckets), **overrides)
        engine = Engine(device_reference_llama, config, backend=graph_backend,
                        piecewise_policy=piecewise_policy)
        engine.prepare_graphs()
        return engine

    return make


@pytest.fixture
def eager_run(device_reference_llama):
    """run(requests, **config overrides) -> generations of an eager engine on the same device."""

    def run(requests, **overrides):
        return Engine(device_reference_llama, replace(TINY_ENGINE_CONFIG, **overrides)).generate(requests)

    return run
