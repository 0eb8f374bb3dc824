"""scripts/fidelity_table.py turns JUnit XML from the CPU and GPU runs into docs/fidelity.md."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fidelity_table.py"

CPU_XML = """<testsuites><testsuite>
<testcase classname="suites.graphs.test_rules" name="test_frozen[emulated]"/>
<testcase classname="suites.graphs.test_rules" name="test_frozen[cuda]"><skipped/></testcase>
<testcase classname="suites.graphs.test_host_sync" name="test_sync[emulated-item]"/>
<testcase classname="suites.graphs.test_emulator" name="test_poison[int64]"/>
</testsuite></testsuites>"""

GPU_XML = """<testsuites><testsuite>
<testcase classname="suites.graphs.test_rules" name="test_frozen[cuda]"/>
<testcase classname="suites.graphs.test_rules" name="test_frozen[emulated-cuda]"><failure/></testcase>
<testcase classname="suites.graphs.test_host_sync" name="test_sync[cuda-item]"/>
</testsuite></testsuites>"""


def _script():
    spec = importlib.util.spec_from_file_location("fidelity_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_backend_is_split_off_the_test_id():
    split = _script().split_backend
    assert split("test_x[emulated-cuda-item]") == ("test_x[item]", "emulated-cuda")
    assert split("test_x[cuda]") == ("test_x", "cuda")
    assert split("test_y[int64]") == ("test_y[int64]", None)


def test_table_from_cpu_and_gpu_runs(tmp_path):
    (tmp_path / "cpu.xml").write_text(CPU_XML)
    (tmp_path / "gpu.xml").write_text(GPU_XML)
    out = tmp_path / "fidelity.md"
    assert _script().main(["--cpu", str(tmp_path / "cpu.xml"), "--gpu", str(tmp_path / "gpu.xml"),
                           "-o", str(out)]) == 0
    rows = _rows(out.read_text())
    assert rows["test_rules::test_frozen"] == ["passed", "passed", "FAILED"]
    assert rows["test_host_sync::test_sync[item]"] == ["passed", "passed", "not run"]
    assert rows["test_emulator::test_poison[int64]"] == ["passed", "emulator only", "emulator only"]


def test_gpu_columns_are_pending_without_a_gpu_run(tmp_path):
    (tmp_path / "cpu.xml").write_text(CPU_XML)
    out = tmp_path / "fidelity.md"
    _script().main(["--cpu", str(tmp_path / "cpu.xml"), "-o", str(out)])
    assert _rows(out.read_text())["test_rules::test_frozen"] == ["passed", "pending", "pending"]


RUNTIME_CPU_XML = """<testsuites><testsuite>
<testcase classname="suites.decoder.test_two_pass" name="test_two_pass"/>
<testcase classname="suites.distributed.test_multirank" name="test_agree[nccl-cuda]"><skipped/></testcase>
<testcase classname="suites.graphs.test_rules" name="test_frozen[emulated]"/>
</testsuite></testsuites>"""

RUNTIME_GPU_XML = """<testsuites><testsuite>
<testcase classname="suites.decoder.test_two_pass" name="test_two_pass"><failure/></testcase>
</testsuite></testsuites>"""

MULTIRANK_GPU_XML = """<testsuites><testsuite>
<testcase classname="suites.distributed.test_multirank" name="test_agree[nccl-cuda]"/>
</testsuite></testsuites>"""


def test_runtime_suites_get_a_table_of_their_own(tmp_path):
    for name, text in (("rc.xml", RUNTIME_CPU_XML), ("rg.xml", RUNTIME_GPU_XML), ("mg.xml", MULTIRANK_GPU_XML),
                       ("cpu.xml", CPU_XML)):
        (tmp_path / name).write_text(text)
    out = tmp_path / "fidelity.md"
    _script().main(["--cpu", str(tmp_path / "cpu.xml"), "--runtime-cpu", str(tmp_path / "rc.xml"),
                    "--runtime-gpu", str(tmp_path / "rg.xml"), "--runtime-gpu", str(tmp_path / "mg.xml"),
                    "-o", str(out)])
    rows = _rows(out.read_text().split("## The runtime suites on each backend")[1])
    assert rows["decoder.test_two_pass::test_two_pass"] == ["passed", "FAILED"]
    assert rows["distributed.test_multirank::test_agree[nccl-cuda]"] == ["skipped", "passed"]
    assert not any(case.startswith("graphs.") for case in rows)  # the contract table has those
