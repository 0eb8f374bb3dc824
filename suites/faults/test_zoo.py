"""Measured detection: each fault's detector fails with the fault planted, naming the cause, the
fault fires, and the same detector passes without it. Every run is a pytest process of its own
(harness.faults.run), so no fault leaks into another test; the clean runs of the whole zoo share one.

Each planted run costs a process that imports torch; pre-merge runs one representative entry, the
nightly list runs the whole zoo as `harness faults` does (one planted run per core at a time)."""

from __future__ import annotations

import pytest

from harness.faults import FAULTS
from harness.faults.run import PytestRun, failed_detectors, outcomes, run_fault, run_zoo

PRE_MERGE = "host-sync-in-capture"


def wanted_verdict(name: str, backend: str, engine_compile: str | None) -> str:
    fault = FAULTS[name]
    if fault.unplantable(backend):
        return "not plantable"
    return "not applicable" if fault.inapplicable(engine_compile) else "detected"


def check_detected(name: str, backend: str, engine_compile: str | None = None) -> None:
    """Detected, or (only for a fault that says why it cannot be planted on this backend, or cannot
    apply on this engine path) reported as such: never a skip, so a fault that stops being caught
    fails here."""
    result = run_fault(FAULTS[name], backend=backend, engine_compile=engine_compile)
    wanted = wanted_verdict(name, backend, engine_compile)
    assert result.verdict == wanted, f"{name}: {result.verdict}: {result.detail}"
    assert wanted != "detected" or (result.fired and result.fired > 0)


def test_representative_fault_is_detected(graph_backend, engine_defaults):
    check_detected(PRE_MERGE, graph_backend.name, engine_defaults.get("compile"))


# The session's --engine-compile (a test-db block's engine_compile) reaches every detector session:
# the nightly lists run the zoo once on the eager ops and once on the compiled path.
@pytest.mark.slow
def test_the_whole_zoo_is_detected_in_one_run(graph_backend, engine_defaults):
    engine_compile = engine_defaults.get("compile")
    runs = run_zoo(FAULTS.values(), backend=graph_backend.name, engine_compile=engine_compile)
    wrong = [f"{r.name}: {r.verdict}: {r.detail}" for r in runs
             if r.verdict != wanted_verdict(r.name, graph_backend.name, engine_compile)]
    assert not wrong, "\n".join(wrong)
    assert [r.name for r in runs] == list(FAULTS)


_SUMMARY = """\
PASSED suites/a.py::test_one
FAILED suites/a.py::test_two - AssertionError: no
PASSED suites/b.py::test_grid[1]
ERROR suites/b.py::test_grid[2] - RuntimeError: teardown
SKIPPED [1] suites/c.py:3: no GPU
"""


def test_the_joint_clean_run_blames_only_the_detectors_that_failed_in_it():
    assert outcomes(_SUMMARY) == {"suites/a.py::test_one": "PASSED", "suites/a.py::test_two": "FAILED",
                                  "suites/b.py::test_grid[1]": "PASSED", "suites/b.py::test_grid[2]": "ERROR"}
    run = PytestRun(1, _SUMMARY, None, 1.0)
    detectors = ["suites/a.py::test_one", "suites/a.py::test_two", "suites/b.py::test_grid",
                 "suites/b.py::test_grid[1]"]
    assert failed_detectors(detectors, run) == {"suites/a.py::test_two", "suites/b.py::test_grid"}


def test_a_detector_absent_from_a_failed_joint_run_is_run_again_alone():
    # A collection error or a crash lists no outcome: nothing says the detector passed.
    crashed = PytestRun(2, "ERROR collecting suites/a.py", None, 1.0)
    assert failed_detectors(["suites/a.py::test_one"], crashed) == {"suites/a.py::test_one"}
    assert failed_detectors(["suites/a.py::test_one"], PytestRun(0, "", None, 1.0)) == set()
