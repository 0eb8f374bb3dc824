"""Fixtures of this project's suite. `graph_backend` and `device` come from the harness plugin
(`--graph-backend auto|cuda|emulated`); override them here to pin a backend or a device."""

from __future__ import annotations

import pytest

from harness.model import tiny_llama
from harness.records import Request
from my_runtime import MyRuntime


@pytest.fixture(scope="session")
def hf_model(device):
    """The model under test. A real project loads its own; the harness' seeded tiny Llama needs no download."""
    return tiny_llama(seed=0, device=device)


@pytest.fixture(scope="session")
def requests():
    return [Request(prompt=[5, 17, 3, 99, 42], max_new_tokens=8, logprobs=3),
            Request(prompt=[7, 7, 8], max_new_tokens=6, logprobs=3)]


@pytest.fixture
def eager_runtime(hf_model):
    return MyRuntime(hf_model)


@pytest.fixture
def graph_runtime(hf_model, graph_backend):
    return MyRuntime(hf_model, backend=graph_backend)
