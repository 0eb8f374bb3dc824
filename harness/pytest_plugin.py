"""The pytest side of the harness: `--graph-backend`, the markers, Hypothesis profiles and the core
fixtures (`graph_backend`, `device`).

Loaded through the `pytest11` entry point, so any project that installs the harness gets it.
"""

from __future__ import annotations

import os

import pytest

BACKEND_CHOICES = ("auto", "cuda", "emulated")

MARKERS = {
    "gpu": "needs CUDA; skipped with a reason where torch.cuda.is_available() is False",
    "multirank": "spawns several torch.distributed processes",
    "slow": "too long for pre-merge; runs in the nightly lists",
    "property": "Hypothesis property test (profile: --hypothesis-profile ci|nightly|repro)",
}

# Stash keys rather than config attributes, so state lives with the session that made it.
_cuda_available = pytest.StashKey[bool]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("capture-harness")
    group.addoption(
        "--graph-backend", choices=BACKEND_CHOICES, default="auto",
        help="graph backend for the graph_backend fixture: auto (cuda when available, else "
             "emulated), cuda, or emulated (CUDA-graph semantics on CPU). Default: auto.",
    )


def _register_hypothesis_profiles() -> None:
    from hypothesis import HealthCheck, settings

    # Pre-merge runs must be reproducible and bounded: a red CI run reruns red.
    settings.register_profile("ci", derandomize=True, max_examples=25, deadline=None, database=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("nightly", max_examples=500, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("repro", derandomize=True, print_blob=True, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])


# tryfirst: Hypothesis' own plugin loads --hypothesis-profile in its pytest_configure, and the
# profile it names must already be registered by then.
@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")

    _register_hypothesis_profiles()
    if not config.getoption("hypothesis_profile", default=None):
        from hypothesis import settings

        settings.load_profile("ci")

    import torch

    cuda = torch.cuda.is_available()
    config.stash[_cuda_available] = cuda
    check_backend_option(config.getoption("graph_backend"), cuda_available=cuda)
    # Each xdist worker is one process of several on the same cores; torch's default of one
    # thread per core would oversubscribe them all.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


def check_backend_option(name: str, *, cuda_available: bool) -> None:
    """Refuse a backend this machine cannot give before any test runs, naming the option."""
    if name == "cuda" and not cuda_available:
        import torch

        raise pytest.UsageError(
            f"--graph-backend cuda needs CUDA, but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}); use --graph-backend emulated or auto"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.stash.get(_cuda_available, False):
        return
    skip = pytest.mark.skip(reason="needs CUDA: torch.cuda.is_available() is False")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def graph_backend(request: pytest.FixtureRequest):
    """The GraphBackend chosen by --graph-backend (auto: cuda when available, else emulated)."""
    # Imported here: harness.graphs imports torch and is built alongside this plugin.
    from harness.graphs import get_backend

    return get_backend(request.config.getoption("graph_backend"))


@pytest.fixture(scope="session")
def device(graph_backend):
    """The torch.device the chosen graph backend captures on."""
    import torch

    return torch.device(graph_backend.device)
