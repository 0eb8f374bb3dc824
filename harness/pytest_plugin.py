"""The pytest side of the harness: `--graph-backend`, the markers, Hypothesis profiles, the core
fixtures (`graph_backend`, `device`), planting a fault for a whole session (`--plant-fault`), and
reproduction files written for failing tests (`--repro-dir`, the `repro_scenario` fixture).

Loaded through the `pytest11` entry point, so every pytest session of an environment that has the
harness installed loads it. It is a guest there: a session that does not use the harness (no harness
option on the command line, no `capture_harness = true` ini setting, no test asking for its fixtures
or markers) sees no profile loaded, no torch imported, no thread count changed and no file written.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
from pathlib import Path

import pytest

from harness.records import BACKENDS as BACKEND_CHOICES


MARKERS = {
    "gpu": "needs CUDA; skipped with a reason where torch.cuda.is_available() is False",
    "multirank": "spawns several torch.distributed processes",
    "slow": "too long for pre-merge; runs in the nightly lists",
    "property": "Hypothesis property test (profile: --hypothesis-profile ci|nightly|repro)",
}
FIXTURES = ("graph_backend", "repro_scenario")  # `device` always comes with graph_backend
PROFILES = ("ci", "nightly", "repro")
USE_INI = "capture_harness"
DEFAULT_REPRO_DIR = "repro"

# Stash keys rather than config attributes, so state lives with the session that made it.
_in_use = pytest.StashKey[bool]()
_cuda_available = pytest.StashKey[bool]()
_planted = pytest.StashKey["tuple[contextlib.ExitStack, object]"]()
_worker_firings = pytest.StashKey[int]()


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
             "streams_tracking.reports), off (no tracking)",
    )
    group.addoption(
        "--plant-fault", metavar="NAME", default=None,
        help="plant the fault NAME of harness.faults.FAULTS for the whole session; the summary "
             "says how many times it fired (xdist workers' firings included)",
    )
    group.addoption(
        "--fault-report", metavar="PATH", type=Path, default=None,
        help="with --plant-fault: write {fault, fired, exitstatus} as JSON to PATH",
    )
    group.addoption(
        "--repro-dir", metavar="DIR", default=None,
        help=f"where a failing test of a harness session writes its reproduction file <test id>.json, "
             f"relative to the rootdir (default: {DEFAULT_REPRO_DIR}); 'none' writes nothing",
    )
    parser.addini(USE_INI, type="bool", default=False,
                  help="use the harness in every session of this project (its Hypothesis profile "
                       "ci by default, one torch thread per xdist worker, reproduction files)")


def _named_on_command_line(config: pytest.Config, option: str) -> bool:
    words = [*config.invocation_params.args, *shlex.split(os.environ.get("PYTEST_ADDOPTS", "")),
             *config.getini("addopts")]
    return any(str(word) == option or str(word).startswith(option + "=") for word in words)


def uses_harness_by_configuration(config: pytest.Config) -> bool:
    """The session asked for the harness before collection: a harness option or the ini setting."""
    return bool(config.getini(USE_INI) or _named_on_command_line(config, "--graph-backend")
                or config.getoption("plant_fault") or config.getoption("fault_report")
                or config.getoption("emulate_cuda", default=False)
                or config.getoption("repro_dir"))


def uses_harness(item: pytest.Item) -> bool:
    """A test asks for the harness: one of its fixtures or markers."""
    return (any(name in item.fixturenames for name in FIXTURES)
            or any(item.get_closest_marker(name) is not None for name in MARKERS))


def _register_hypothesis_profiles(names, *, keep_existing: bool) -> None:
    from hypothesis import HealthCheck, settings
    from hypothesis.errors import InvalidArgument

    profiles = {
        # Pre-merge runs must be reproducible and bounded: a red CI run reruns red.
        "ci": dict(derandomize=True, max_examples=25, deadline=None, database=None,
                   suppress_health_check=[HealthCheck.too_slow]),
        "nightly": dict(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow]),
        "repro": dict(derandomize=True, print_blob=True, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow]),
    }
    for name in names:
        if keep_existing:
            with contextlib.suppress(InvalidArgument):
                settings.get_profile(name)
                continue
        settings.register_profile(name, **profiles[name])


# tryfirst: Hypothesis' own plugin loads --hypothesis-profile in its pytest_configure, and the
# profile it names must already be registered by then.
@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    in_use = uses_harness_by_configuration(config)
    config.stash[_in_use] = in_use

    profile = config.getoption("hypothesis_profile", default=None)
    if in_use:
        _register_hypothesis_profiles(PROFILES, keep_existing=False)
        from hypothesis import settings

        # Hypothesis itself loads its own `ci` profile where it detects CI; a profile the project
        # loaded itself under another name is kept.
        if not profile and settings.get_current_profile_name() in ("default", "ci"):
            settings.load_profile("ci")
    elif profile in PROFILES:
        # Not a harness session: a profile of that name the project registered itself wins.
        _register_hypothesis_profiles([profile], keep_existing=True)

    _enter_emulated_cuda(config)  # before anything asks torch.cuda, collection included
    backend_option = config.getoption("graph_backend")
    if backend_option == "cuda":
        check_backend_option(backend_option, cuda_available=_cuda(config))
    check_fault_option(config.getoption("plant_fault"), backend_option)
    if in_use:
        _one_thread_per_worker()


def _cuda(config: pytest.Config) -> bool:
    if _cuda_available not in config.stash:
        import torch

        config.stash[_cuda_available] = torch.cuda.is_available()
    return config.stash[_cuda_available]


def _one_thread_per_worker() -> None:
    # Each xdist worker is one process of several on the same cores; torch's default of one
    # thread per core would oversubscribe them all.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


# --- --emulate-cuda: the whole session inside harness.emulate_cuda() ------------------------------
_emulation = pytest.StashKey["contextlib.ExitStack"]()


def _enter_emulated_cuda(config: pytest.Config) -> None:
    if not config.getoption("emulate_cuda", default=False) or _emulation in config.stash:
        return
    from harness import emulate_cuda

    stack = contextlib.ExitStack()
    stack.enter_context(emulate_cuda(schedule=config.getoption("cuda_schedule"),
                                     races=config.getoption("cuda_races"), children=True))
    config.stash[_emulation] = stack


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Under --emulate-cuda, a strict race found when the test's tensors were freed fails that
    test (a finalizer cannot raise; without this, the next test's first device op would)."""
    if _emulation not in item.config.stash:
        return (yield)
    try:
        result = yield
    except BaseException:
        _late_races()  # the test failed already: its frees' races must not reach the next one
        raise
    late = _late_races()
    if late:
        raise late[0]
    return result


def _late_races() -> list:
    from harness.emulation import emulation_active
    from harness.emulation.session import active_state

    if emulation_active() != "cpu":
        return []
    tracking = getattr(active_state(), "streams_tracking", None)
    return [] if tracking is None else tracking.take_late_races()


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
    handle.fired += session.config.stash.get(_worker_firings, 0)
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller adds this to its count
        workeroutput["harness_fault_fired"] = handle.fired
    path = session.config.getoption("fault_report")
    if path is not None and workeroutput is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"fault": handle.name, "fired": handle.fired,
                                    "exitstatus": int(exitstatus)}) + "\n")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist's controller, as a worker ends: its firings of the planted fault join the count."""
    fired = getattr(node, "workeroutput", {}).get("harness_fault_fired", 0)
    config = node.config
    config.stash[_worker_firings] = config.stash.get(_worker_firings, 0) + fired


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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    folder = item.config.getoption("repro_dir") or DEFAULT_REPRO_DIR
    if (report.failed and report.when in ("setup", "call") and folder != "none"
            and (item.config.stash.get(_in_use, False) or uses_harness(item))):
        path = write_repro_file(item, report, item.config.rootpath / folder)
        slot = getattr(item, "funcargs", {}).get("repro_scenario")
        explain = f"\nharness explain {path}" if getattr(slot, "scenario", None) is not None else ""
        report.sections.append(("reproduction", f"harness repro {path}{explain}"))
        # Reported with the test (JUnit XML <properties>), so `harness run` can list the files.
        item.user_properties.append(("reproduction", str(path)))
    return report


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
    if not config.stash.get(_in_use, False) and any(uses_harness(item) for item in items):
        config.stash[_in_use] = True
        _one_thread_per_worker()
    needs_cuda = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not needs_cuda or _cuda(config):
        return
    skip = pytest.mark.skip(reason="needs CUDA: torch.cuda.is_available() is False")
    for item in needs_cuda:
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
