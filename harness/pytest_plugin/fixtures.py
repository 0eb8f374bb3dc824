"""The core fixtures: `graph_backend` (chosen by --graph-backend) and `device`."""

from __future__ import annotations

import pytest

from harness.pytest_plugin.emulation_session import session_device


@pytest.fixture(scope="session")
def graph_backend(request: pytest.FixtureRequest):
    """The GraphBackend chosen by --graph-backend (auto: cuda when available, else emulated)."""
    # Imported here: harness.graphs imports torch and is built alongside this plugin.
    from harness.graphs import get_backend

    return get_backend(request.config.getoption("graph_backend"), device=session_device(request.config))


@pytest.fixture(scope="session")
def device(graph_backend):
    """The torch.device the chosen graph backend captures on."""
    import torch

    return torch.device(graph_backend.device)
