"""The fault registry: well-formed entries, planting that fires and is undone, and the verdicts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from harness.faults import FAULTS, Fault, NotPlantableError, inject
from harness.faults.registry import inject_fault, registry
from harness.faults.run import FaultRun, PytestRun, judge
from harness.faults.table import markdown_table, text_table
from harness.ops import attention
from harness.ops.metadata import AttentionMetadata

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", list(FAULTS))
def test_entry_has_a_link_a_bug_class_and_an_existing_detector(name):
    fault = FAULTS[name]
    assert fault.name == name
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+", fault.link), fault.link
    assert len(fault.bug_class) > 20 and "\n" not in fault.bug_class
    path, _, test = fault.detector.partition("::")
    source = (ROOT / path).read_text()
    function = test.split("[")[0]
    assert re.search(rf"^def {function}\(", source, re.MULTILINE), f"{fault.detector} is not defined"


def test_names_are_unique_and_well_formed():
    fault = FAULTS["metadata-rebound"]
    with pytest.raises(ValueError, match="registered twice"):
        registry((fault,), (fault,))
    with pytest.raises(ValueError, match="lowercase words"):
        Fault("Bad_Name", "x", "y", "a.py::t", "e", fault.plant)
    with pytest.raises(ValueError, match="not a pytest node id"):
        Fault("bad", "x", "y", "a.py", "e", fault.plant)


def test_unknown_fault_is_a_key_error_naming_the_known_ones():
    with pytest.raises(KeyError, match="no fault named 'nope'; known faults: .*metadata-rebound"):
        with inject("nope"):
            pass


def test_planting_fires_and_is_undone_everywhere():
    from harness.ops.sparse_attention import write_kv as sparse_write_kv

    original_prepare = AttentionMetadata.__dict__["prepare"]
    original_write = attention.write_kv
    with inject("pad-rows-write-real-kv") as handle:
        import harness.ops.sparse_attention as sparse

        assert attention.write_kv is not original_write and sparse.write_kv is attention.write_kv
        layer = torch.zeros(2, 3, 2, 1, 1)
        attention.write_kv(layer, torch.ones(1, 1, 1), torch.ones(1, 1, 1), torch.tensor([4]))
        assert handle.fired == 1
        assert layer.flatten(1, 2)[:, 0].eq(1).all()  # the pad slot 4 landed in real slot 0
    assert attention.write_kv is original_write and sparse_write_kv is original_write
    with inject("metadata-rebound") as handle:
        md = AttentionMetadata(2, 4, 2, 4, 8)
        buffer = md.seq_lens
        md.prepare([])
        assert md.seq_lens is not buffer and handle.fired == 2  # __init__ prepares once too
    assert AttentionMetadata.__dict__["prepare"] is original_prepare


def test_a_fault_unplantable_on_a_backend_is_refused_naming_why():
    base = FAULTS["host-sync-in-capture"]
    fault = Fault(name="cuda-only", bug_class=base.bug_class, link=base.link, detector=base.detector,
                  expected=base.expected, plant=base.plant,
                  unplantable=lambda backend: "needs CUDA's allocator" if backend == "emulated" else None)
    with pytest.raises(NotPlantableError, match="'cuda-only' is not plantable on this build for the "
                                                "emulated backend: needs CUDA's allocator"):
        with inject_fault(fault, "emulated"):
            pass
    with inject_fault(fault, "cuda") as handle:
        assert handle.fired == 0


FAULT = FAULTS["host-sync-in-capture"]
SYNC = "E   CaptureError: aten.x cannot be captured: reads device data on the host (a sync)"


@pytest.mark.parametrize("planted,clean,verdict", [
    (PytestRun(1, SYNC, 3, 1.0), PytestRun(0, "", None, 1.0), "detected"),
    (PytestRun(0, "1 passed", 3, 1.0), None, "missed"),
    (PytestRun(1, SYNC, 0, 1.0), PytestRun(0, "", None, 1.0), "not fired"),
    (PytestRun(1, "E   AssertionError", 2, 1.0), PytestRun(0, "", None, 1.0), "wrong diagnosis"),
    (PytestRun(1, SYNC, 2, 1.0), PytestRun(1, "E  boom", None, 1.0), "false positive"),
    (PytestRun(4, "ERROR: usage", None, 1.0), None, "error"),
])
def test_judge_gives_each_verdict(planted, clean, verdict):
    assert judge(FAULT, planted, clean)[0] == verdict


def test_tables_show_verdicts_links_and_columns_per_run():
    runs = [FaultRun("host-sync-in-capture", "detected", FAULT.detector, 4.25, 1),
            FaultRun("captured-buffer-freed", "not plantable", "x::y", 0.0, detail="no | error")]
    text = text_table(runs)
    assert re.search(r"^host-sync-in-capture +detected +\S+ +4\.2$", text, re.MULTILINE), text
    assert "captured-buffer-freed: no | error" in text
    cpu = {"backend": "emulated", "device": "x86", "torch": "2.13", "commit": "abc",
           "runs": [r.to_dict() for r in runs]}
    cuda = dict(cpu, backend="cuda", device="NVIDIA H200", runs=[runs[0].to_dict()])
    table = markdown_table({name: FAULTS[name] for name in ("host-sync-in-capture", "captured-buffer-freed")},
                           [cpu, cuda])
    header, _, sync_row, freed_row = table.splitlines()[:4]
    assert header.endswith("| emulated (x86, torch 2.13) | cuda (NVIDIA H200, torch 2.13) |")
    assert FAULT.link in sync_row and sync_row.endswith("| detected (4.2 s) | detected (4.2 s) |")
    assert freed_row.endswith("| not plantable: no \\| error | not run |")


def test_spawned_processes_plant_the_inherited_fault_and_report_firings(tmp_path, monkeypatch):
    from harness.faults import FIRINGS_FILE_VARIABLE, PLANTED_FAULT_VARIABLE, inherited_fault
    from harness.faults import inherited_firings

    with inherited_fault() as handle:
        assert handle is None  # nothing planted in this session
    firings = tmp_path / "fired"
    monkeypatch.setenv(PLANTED_FAULT_VARIABLE, "pad-rows-write-real-kv")
    monkeypatch.setenv(FIRINGS_FILE_VARIABLE, str(firings))
    original = attention.write_kv
    for _ in range(2):  # two rank processes
        with inherited_fault() as handle:
            assert attention.write_kv is not original
            attention.write_kv(torch.zeros(2, 2, 1, 1, 1), torch.ones(1, 1, 1), torch.ones(1, 1, 1),
                               torch.tensor([1]))
    assert attention.write_kv is original
    assert inherited_firings(firings) == 2


def test_plant_fault_option_refuses_an_unknown_or_unplantable_fault():
    from harness.pytest_plugin import check_fault_option

    with pytest.raises(pytest.UsageError, match="--plant-fault nope: no such fault; known faults: "):
        check_fault_option("nope", "emulated")
    check_fault_option("metadata-rebound", "emulated")
    check_fault_option(None, "emulated")


def test_plant_fault_option_refuses_a_fault_not_applicable_on_the_sessions_engine_path():
    from harness.pytest_plugin import check_fault_option

    with pytest.raises(pytest.UsageError, match=r"--plant-fault max-seq-len-baked --engine-compile "
                                                r"inductor: not applicable on the compiled path: the "
                                                r"compiled path's traced body calls paged_attention_op"):
        check_fault_option("max-seq-len-baked", "emulated", "inductor")
    check_fault_option("max-seq-len-baked", "emulated", "none")
    check_fault_option("metadata-rebound", "emulated", "inductor")


def test_a_fault_that_never_fired_shows_why_its_run_failed():
    """A planted run that stops before the planted code (a fixture error, an import) says why: the
    verdict alone would hide a broken detector."""
    planted = PytestRun(1, "E   TypeError: planted() takes 1 positional argument but 2 were given", 0, 1.0)
    verdict, detail = judge(FAULT, planted, PytestRun(0, "", None, 1.0))
    assert verdict == "not fired" and "TypeError: planted() takes 1 positional argument" in detail
