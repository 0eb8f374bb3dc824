"""The pytest side of the harness, loaded through the `pytest11` entry point, so every pytest
session of an environment that has the harness installed loads it. It is a guest there: it acts
only through its own options (`--graph-backend`, `--emulate-cuda`...), its own fixtures and its own
markers (`harness_gpu`...); the short markers `gpu`, `slow`, `multirank`, `property` are the
harness's only in a project with `capture_harness = true`. A session that uses none of them sees no
profile loaded, no torch imported, no thread count changed, no test skipped and no file written.

One job a module: options.py (options, ini keys, refusals), markers.py, hypothesis_profiles.py,
emulation_session.py (--emulate-cuda), planted_fault.py (--plant-fault), repro_files.py,
fixtures.py, junit_part.py (one JUnit path under `harness run`), torch_trace_log.py (pytest's
log capture kept off torch's trace logger). The hooks below only put them in order.
"""

from __future__ import annotations

import os

import pytest

from harness.pytest_plugin import emulation_session, junit_part, markers, planted_fault, repro_files
from harness.pytest_plugin.fixtures import device, graph_backend
from harness.pytest_plugin.hypothesis_profiles import PROFILES
from harness.pytest_plugin.hypothesis_profiles import configure as configure_profiles
from harness.pytest_plugin.options import (
    add_options, check_backend_option, opted_in, uses_harness_by_configuration,
)
from harness.pytest_plugin.planted_fault import check_fault_option
from harness.pytest_plugin.repro_files import ScenarioSlot, repro_scenario
from harness.pytest_plugin.torch_trace_log import detach_pytest_handlers

__all__ = ["PROFILES", "ScenarioSlot", "check_backend_option", "check_fault_option", "device",
           "graph_backend", "repro_scenario", "uses_harness", "uses_harness_by_configuration"]

FIXTURES = ("graph_backend", "repro_scenario")  # `device` always comes with graph_backend

# Stash keys rather than config attributes, so state lives with the session that made it.
_in_use = pytest.StashKey[bool]()
_opted_in = pytest.StashKey[bool]()
_cuda_available = pytest.StashKey[bool]()


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def uses_harness(item: pytest.Item) -> bool:
    """A test asks for the harness: one of its fixtures or markers (short names where opted in)."""
    return (any(name in item.fixturenames for name in FIXTURES)
            or markers.carries_any(item, opted_in=item.config.stash.get(_opted_in, False)))


# tryfirst: Hypothesis' own plugin loads --hypothesis-profile in its pytest_configure, and the
# profile it names must already be registered by then.
@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.stash[_opted_in] = opted_in(config)
    markers.register(config, opted_in=config.stash[_opted_in])
    in_use = uses_harness_by_configuration(config)
    config.stash[_in_use] = in_use
    configure_profiles(config, in_use=in_use)

    emulation_session.enter(config)  # before anything asks torch.cuda, collection included
    backend_option = config.getoption("graph_backend")
    if backend_option == "cuda":
        check_backend_option(backend_option, cuda_available=_cuda(config))
    check_fault_option(config.getoption("plant_fault"), backend_option,
                       config.getoption("engine_compile", default=None))
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


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = emulation_session.header(config)
    compile_mode = config.getoption("engine_compile", default=None)
    if compile_mode is not None:
        # A planted run's output says which engine path judged it (harness faults --engine-compile).
        lines.append(f"harness: engines compile={compile_mode} where their config leaves "
                     f"EngineConfig.compile unset (--engine-compile)")
    return lines


# trylast: inside pytest's logging wrappers, once they have attached their handlers.
@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_setup(item: pytest.Item):
    if item.config.stash.get(_in_use, False):
        detach_pytest_handlers()
    result = yield
    _raise_late_races(item)  # a fixture's setup freed memory another stream may still use
    return result


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem):
    """Under --emulate-cuda, what a test's teardown leaves is its own: a race found at a free in a
    fixture's finalizer fails this teardown, and a stream left current is reset and named, rather
    than surfacing in whichever test its worker runs next."""
    if item.config.stash.get(_in_use, False):
        detach_pytest_handlers()
    result = yield
    if emulation_session.active(item.config):
        try:
            emulation_session.end_generators_left_capturing()
            emulation_session.restore_default_stream(item.nodeid)
        finally:
            _raise_late_races(item, test_ended=True)
    return result


def _raise_late_races(item: pytest.Item, *, test_ended: bool = False) -> None:
    if emulation_session.active(item.config):
        late = emulation_session.late_races(test_ended=test_ended)
        if late:
            raise late[0]


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item):
    """Under --emulate-cuda, a strict race found when the test's tensors were freed fails that
    test (a finalizer cannot raise; without this, the next test's first device op would)."""
    if item.config.stash.get(_in_use, False):
        detach_pytest_handlers()
    if not emulation_session.active(item.config):
        return (yield)
    try:
        result = yield
    except BaseException:
        # The test failed already: its frees' races must not reach its teardown or the next test.
        emulation_session.late_races(test_ended=True)
        raise
    late = emulation_session.late_races()
    if late:
        raise late[0]
    return result


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    emulation_session.leave(config)


@pytest.hookimpl(specname="pytest_unconfigure", tryfirst=True)
def pytest_unconfigure_junit_part(config: pytest.Config) -> None:
    junit_part.restore(config)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    planted_fault.plant(session.config)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    planted_fault.finish(session, exitstatus)


# A second sessionfinish impl (specname; pytest reads only names starting pytest_). trylast:
# inside the terminal reporter's wrapper, which prints the summary after its yield; by
# then the JUnit writer (not a wrapper) has written the file.
@pytest.hookimpl(specname="pytest_sessionfinish", wrapper=True, trylast=True)
def pytest_sessionfinish_junit_part(session: pytest.Session, exitstatus: int):
    result = yield
    if session.config.getoption("junit_part_of_run", default=False):
        junit_part.silence(session.config)
    return result


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    planted_fault.add_worker_firings(node)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    line = planted_fault.summary_line(config)
    if line is not None:
        terminalreporter.write_line(line)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    config = item.config
    if (report.failed and report.when in ("setup", "call") and repro_files.folder(config) != "none"
            and (config.stash.get(_in_use, False) or uses_harness(item))):
        choice = emulation_session.chosen_device(config)
        repro_files.attach(item, report, pytest_options=choice.device.pytest_args() if choice else [],
                           fault=planted_fault.planted_name(config))
    return report


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    emulation_session.align_torch_testcase(config)  # the test modules are imported by now
    if not config.stash.get(_in_use, False) and any(uses_harness(item) for item in items):
        config.stash[_in_use] = True
        _one_thread_per_worker()
    markers.skip_without_cuda(items, opted_in=config.stash.get(_opted_in, False),
                              cuda_available=lambda: _cuda(config))
