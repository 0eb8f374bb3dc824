"""Decoder-graph suites: engines in graph mode on the session's graph backend, against eager.

The requests finish at different steps, so decode batches shrink through 8 and down to 1 and every
captured size (8, 4, 2, 1) is replayed; top-2 logprobs let the comparison allow near-tie flips.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from fixtures.models import TINY_ENGINE_CONFIG, mixed_requests
from harness.runtime import Engine
from harness.runtime.config import fill_unset

SIZES = (8, 4, 2, 1)
# The last request runs one step longer than any other, so a decode batch of 1 happens.
MAX_NEW_TOKENS = (8, 16, 9, 12, 10, 17, 11, 13)


@pytest.fixture(scope="module")
def decode_requests():
    return mixed_requests(logprobs=2, max_new_tokens=MAX_NEW_TOKENS)


@pytest.fixture(scope="module")
def eager_decode(device_reference_llama, decode_requests):
    return Engine(device_reference_llama, TINY_ENGINE_CONFIG).generate(decode_requests)


@pytest.fixture
def make_engine(device_reference_llama, graph_backend, engine_defaults):
    """make(**config_overrides, engine_kwargs...) -> an Engine in graph mode (sizes SIZES); `model`
    and `backend` default to the session's."""

    def make(*, model=None, backend=None, comm=None, capture_scope=None, capture_features=None,
             capture_policy=None, **overrides) -> Engine:
        config = fill_unset(replace(TINY_ENGINE_CONFIG, **{"decode_graph_sizes": SIZES, **overrides}),
                            engine_defaults)
        kwargs = {k: v for k, v in dict(comm=comm, capture_scope=capture_scope,
                                        capture_features=capture_features,
                                        capture_policy=capture_policy).items() if v is not None}
        return Engine(device_reference_llama if model is None else model, config,
                      backend=graph_backend if backend is None else backend, **kwargs)

    return make


@pytest.fixture(scope="module")
def two_pass_run(device_reference_llama, graph_backend, decode_requests):
    """(engine, generations) of the default two-pass capture: the baseline of the single pass."""
    config = replace(TINY_ENGINE_CONFIG, decode_graph_sizes=SIZES, single_pass_capture=False)
    engine = Engine(device_reference_llama, config, backend=graph_backend)
    return engine, engine.generate(decode_requests)
