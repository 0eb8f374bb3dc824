"""The fault zoo with the detectors' engines on the compiled path (`harness faults --engine-compile
inductor`; a test-db block's `engine_compile`): every detector session gets pytest's
--engine-compile, a fault that applies is planted and judged there, and a fault planted into code
that path never runs is reported "not applicable" with its reason, not run and not missed."""

from __future__ import annotations

import pytest

from harness.faults import FAULTS, Fault
from harness.faults.run import run_detector, run_fault, run_zoo
from harness.faults.table import markdown_table, run_document, text_table
from harness.provenance import checkout_root

BASE = FAULTS["host-sync-in-capture"]
EAGER_ONLY = "planted into the eager model's forward, which the compiled step never calls"
# Not in the registry: a session asked to plant it by name would fail, so a run of it shows.
NOT_ON_COMPILED = Fault(name="eager-forward-only", bug_class=BASE.bug_class, link=BASE.link,
                        detector=BASE.detector, expected=BASE.expected, plant=BASE.plant,
                        not_on_compiled_path=EAGER_ONLY)
# Its detector skipped on the compiled path before that path's step was observed there.
SCOPE = FAULTS["capture-outside-its-scope"]


def test_a_fault_that_cannot_apply_is_reported_not_applicable_and_not_run():
    wanted = f"not applicable on the compiled path: {EAGER_ONLY}"
    alone = run_fault(NOT_ON_COMPILED, backend="emulated", engine_compile="inductor")
    assert (alone.verdict, alone.detail, alone.seconds, alone.fired) == ("not applicable", wanted, 0.0, None)
    in_zoo = run_zoo([NOT_ON_COMPILED], backend="emulated", engine_compile="inductor", jobs=1)
    assert in_zoo == [alone]
    assert f"eager-forward-only: {wanted}" in text_table(in_zoo)
    document = run_document(in_zoo, backend="emulated", commit="abc", engine_compile="inductor")
    table = markdown_table({NOT_ON_COMPILED.name: NOT_ON_COMPILED}, [document])
    header, _, row = table.splitlines()[:3]
    assert header.endswith(", engines compile=inductor) |"), header
    assert row.endswith(f"| {wanted} |"), row


def test_the_reason_applies_only_on_the_compiled_path():
    assert NOT_ON_COMPILED.inapplicable("inductor") == EAGER_ONLY
    assert NOT_ON_COMPILED.inapplicable(None) is None and NOT_ON_COMPILED.inapplicable("none") is None
    with pytest.raises(ValueError, match="fault blank: not_on_compiled_path must say why, got ' '"):
        Fault(name="blank", bug_class=BASE.bug_class, link=BASE.link, detector=BASE.detector,
              expected=BASE.expected, plant=BASE.plant, not_on_compiled_path=" ")


def test_an_unknown_engine_compile_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"engine_compile must be one of \[None, 'none', 'inductor'\], "
                                         r"got 'max-autotune'"):
        run_fault(BASE, backend="emulated", engine_compile="max-autotune")


@pytest.mark.slow
def test_a_planted_fault_is_detected_with_its_detector_on_the_compiled_path(tmp_path):
    # The detector skipped on the compiled path until it observed the compiled step: a pass there.
    planted = run_detector(SCOPE.detector, backend="emulated", fault=SCOPE.name, root=checkout_root(),
                           workdir=tmp_path, engine_compile="inductor")
    assert planted.returncode == 1 and planted.fired, planted.output[-2000:]
    assert "(capture) ran under 'warmup', not 'serving'" in planted.output, planted.output[-2000:]
    result = run_fault(SCOPE, backend="emulated", engine_compile="inductor")
    assert result.verdict == "detected", f"{result.verdict}: {result.detail}"
