"""The pytest side of the harness: `--graph-backend`, the markers, Hypothesis profiles, the core
fixtures (`graph_backend`, `device`), planting a fault for a whole session (`--plant-fault`), and
reproduction files written for failing tests (`--repro-dir`, the `repro_scenario` fixture).

Loaded through the `pytest11` entry point, so any project that installs the harness gets it.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

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
_planted = pytest.StashKey["tuple[contextlib.ExitStack, object]"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("capture-harness")
    group.addoption(
        "--graph-backend", choices=BACKEND_CHOICES, default="auto",
        help="graph backend for the graph_backend fixture: auto (cuda when available, else "
             "emulated), cuda, or emulated (CUDA-graph semantics on CPU). Default: auto.",
    )
    group.addoption(
        "--emulate-cuda", action="store_true", default=False,
        help="run the whole session inside harness.emulate_cuda(): code written for CUDA runs "
             "unmodified (an emulated CUDA device on a machine without a GPU, the graph sanitizer "
             "on one); the device fixture is cuda and graph_backend captures through "
             "torch.cuda.graph",
    )
    group.addoption(
        "--cuda-schedule", choices=("issue_order", "adversarial"), default="issue_order",
        help="with --emulate-cuda: when the emulated device runs each stream's work: issue_order "
             "(at once, default) or adversarial (as late as synchronization allows, so a missing "
             "wait gives wrong values every time)",
    )
    group.addoption(
        "--cuda-races", choices=("strict", "report", "off"), default="strict",
        help="with --emulate-cuda: what a race between streams and the host does: strict (raises "
             "RaceError at the second access, default), report (collected on the device state's "
             "streams_tracking.work.tracker.reports), off (no tracking)",
    )
    group.addoption(
        "--plant-fault", metavar="NAME", default=None,
        help="plant the fault NAME of harness.faults.FAULTS for the whole session (run one "
             "detector with -p no:xdist); the summary says how many times it fired",
    )
    group.addoption(
        "--fault-report", metavar="PATH", type=Path, default=None,
        help="with --plant-fault: write {fault, fired, exitstatus} as JSON to PATH",
    )
    group.addoption(
        "--repro-dir", metavar="DIR", default="repro",
        help="where a failing test writes its reproduction file <test id>.json, relative to the "
             "rootdir (default: repro); 'none' writes nothing",
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

    _enter_emulated_cuda(config)  # before anything asks torch.cuda, collection included
    import torch

    cuda = torch.cuda.is_available()
    config.stash[_cuda_available] = cuda
    check_backend_option(config.getoption("graph_backend"), cuda_available=cuda)
    check_fault_option(config.getoption("plant_fault"), config.getoption("graph_backend"))
    # Each xdist worker is one process of several on the same cores; torch's default of one
    # thread per core would oversubscribe them all.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


# --- --emulate-cuda: the whole session inside harness.emulate_cuda() ------------------------------
_emulation = pytest.StashKey["contextlib.ExitStack"]()


def _enter_emulated_cuda(config: pytest.Config) -> None:
    if not config.getoption("emulate_cuda", default=False) or _emulation in config.stash:
        return
    from harness import emulate_cuda

    stack = contextlib.ExitStack()
    stack.enter_context(emulate_cuda(schedule=config.getoption("cuda_schedule"),
                                     races=config.getoption("cuda_races")))
    config.stash[_emulation] = stack


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    stack = config.stash.get(_emulation, None)
    if stack is not None:
        del config.stash[_emulation]
        stack.close()


def _session_device(config: pytest.Config) -> str | None:
    """"cuda" under --emulate-cuda, where the fixtures put the session on the (emulated) device."""
    return "cuda" if config.getoption("emulate_cuda", default=False) else None
# --- end of --emulate-cuda ---------------------------------------------------------------------


def check_backend_option(name: str, *, cuda_available: bool) -> None:
    """Refuse a backend this machine cannot give before any test runs, naming the option."""
    if name == "cuda" and not cuda_available:
        import torch

        raise pytest.UsageError(
            f"--graph-backend cuda needs CUDA, but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}); use --graph-backend emulated or auto"
        )


def check_fault_option(name: str | None, backend_option: str) -> None:
    """Refuse an unknown fault, or one this build cannot plant, before any test runs."""
    if name is None:
        return
    from harness.faults import FAULTS
    from harness.graphs import resolve_backend

    fault = FAULTS.get(name)
    if fault is None:
        raise pytest.UsageError(f"--plant-fault {name}: no such fault; known faults: "
                                f"{', '.join(sorted(FAULTS))}")
    backend = resolve_backend(backend_option)
    reason = fault.unplantable(backend)
    if reason:
        raise pytest.UsageError(f"--plant-fault {name}: not plantable on this build for the "
                                f"{backend} backend: {reason}")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # Before collection: test modules imported afterwards bind the planted functions.
    config = session.config
    name = config.getoption("plant_fault")
    if name is None:
        return
    import tempfile

    from harness.faults import FIRINGS_FILE_VARIABLE, PLANTED_FAULT_VARIABLE, inherited_firings, inject
    from harness.graphs import resolve_backend

    stack = contextlib.ExitStack()
    handle = stack.enter_context(inject(name, resolve_backend(config.getoption("graph_backend"))))
    # Spawned rank processes plant it again through harness.faults.inherited_fault.
    firings = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fault-firings-"))) / "fired"
    stack.enter_context(_environment({PLANTED_FAULT_VARIABLE: name, FIRINGS_FILE_VARIABLE: str(firings)}))
    stack.callback(lambda: setattr(handle, "fired", handle.fired + inherited_firings(firings)))
    config.stash[_planted] = (stack, handle)


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    planted = session.config.stash.get(_planted, None)
    if planted is None:
        return
    stack, handle = planted
    stack.close()
    path = session.config.getoption("fault_report")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"fault": handle.name, "fired": handle.fired,
                                    "exitstatus": int(exitstatus)}) + "\n")


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    planted = config.stash.get(_planted, None)
    if planted is not None:
        _, handle = planted
        terminalreporter.write_line(f"planted fault {handle.name}: fired {handle.fired} times")


class ScenarioSlot:
    """What `repro_scenario` gives a test: `record(Scenario(...))` puts the engine-level comparison
    the test runs into its reproduction file, so `harness repro` can replay it without pytest."""

    def __init__(self) -> None:
        self.scenario = None

    def record(self, scenario) -> None:
        self.scenario = scenario


@pytest.fixture
def repro_scenario() -> ScenarioSlot:
    return ScenarioSlot()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    report = outcome.get_result()
    folder = item.config.getoption("repro_dir")
    if report.failed and report.when in ("setup", "call") and folder != "none":
        path = write_repro_file(item, report, item.config.rootpath / folder)
        report.sections.append(("reproduction", f"harness repro {path}"))


def write_repro_file(item: pytest.Item, report: pytest.TestReport, folder: Path) -> Path:
    import torch

    from harness.graphs import resolve_backend
    from harness.repro import ReproRecord, hypothesis_example, write_record

    config = item.config
    backend = resolve_backend(config.getoption("graph_backend"))
    options = [f"--graph-backend={backend}"]
    if config.getoption("emulate_cuda", default=False):
        options.append("--emulate-cuda")
    profile = config.getoption("hypothesis_profile", default=None)
    seed = config.getoption("hypothesis_seed", default=None)
    if profile:
        options += ["--hypothesis-profile", profile]
    if seed is not None:
        options += ["--hypothesis-seed", str(seed)]
    slot = getattr(item, "funcargs", {}).get("repro_scenario")
    planted = config.stash.get(_planted, None)
    text = report.longreprtext
    errors = [line for line in text.splitlines() if line.startswith("E ")]
    record = ReproRecord(
        node_id=item.nodeid, root=str(config.rootpath), backend=backend, torch=torch.__version__,
        pytest_options=tuple(options),
        seeds={"hypothesis_seed": seed, "torch_initial_seed": torch.initial_seed()},
        hypothesis_example=hypothesis_example(text), fault=planted[1].name if planted else None,
        scenario=slot.scenario if isinstance(slot, ScenarioSlot) else None,
        failure="\n".join(errors[:40]) or "\n".join(text.splitlines()[-40:]))
    return write_record(record, folder)


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

    return get_backend(request.config.getoption("graph_backend"), device=_session_device(request.config))


@pytest.fixture(scope="session")
def device(graph_backend):
    """The torch.device the chosen graph backend captures on."""
    import torch

    return torch.device(graph_backend.device)
