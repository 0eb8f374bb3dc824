"""The fault zoo's decode-graph bugs are caught through the overlap loop too: with a fault planted,
the overlap engine's generations leave the eager baseline (and they match it without the fault,
which suites/decoder/test_overlap.py shows)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fixtures.models import TINY_ENGINE_CONFIG, mixed_requests
from harness.check.compare import compare_generations
from harness.faults import inject
from harness.runtime import Engine

# One pre-merge; the other waits for nightly.
PLANTED = ["padding-dummy-aliases-live-blocks", pytest.param("metadata-rebound", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", PLANTED)
def test_a_planted_decode_graph_fault_shows_through_the_overlap_loop(device_reference_llama, graph_backend,
                                                                      name):
    requests = mixed_requests(logprobs=2, max_new_tokens=(8, 16, 9, 12, 10, 17, 11, 13))
    eager = Engine(device_reference_llama, TINY_ENGINE_CONFIG).generate(requests)
    config = replace(TINY_ENGINE_CONFIG, decode_graph_sizes=(8, 4, 2, 1), overlap=True)
    with inject(name, graph_backend.name) as handle:
        actual = Engine(device_reference_llama, config, backend=graph_backend).generate(requests)
    assert handle.fired
    assert not compare_generations(eager, actual).ok
