"""Measured detection: each fault's detector fails with the fault planted, naming the cause, the
fault fires, and the same detector passes without it. Every run is a pytest process of its own
(harness.faults.run), so no fault leaks into another test.

Each pair of runs costs two processes that import torch; pre-merge runs one representative entry,
the nightly list runs the whole zoo (`harness faults` prints the same as a table)."""

from __future__ import annotations

import pytest

from harness.faults import FAULTS
from harness.faults.run import run_fault

PRE_MERGE = "host-sync-in-capture"


def check_detected(name: str, backend: str) -> None:
    """Detected, or (only for a fault that says why it cannot be planted on this backend) reported
    as not plantable: never a skip, so a fault that stops being caught fails here."""
    fault = FAULTS[name]
    result = run_fault(fault, backend=backend)
    wanted = "not plantable" if fault.unplantable(backend) else "detected"
    assert result.verdict == wanted, f"{name}: {result.verdict}: {result.detail}"
    assert wanted != "detected" or (result.fired and result.fired > 0)


def test_representative_fault_is_detected(graph_backend):
    check_detected(PRE_MERGE, graph_backend.name)


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name in FAULTS if name != PRE_MERGE])
def test_every_fault_is_detected(graph_backend, name):
    check_detected(name, graph_backend.name)
