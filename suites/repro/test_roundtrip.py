"""A failing suite test writes a reproduction file that replays standalone: planted fault in, the
replay fails with the same report every time; fault out, it passes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.repro import load_record

ROOT = Path(__file__).resolve().parents[2]
DETECTOR = "suites/model/test_capturable.py::test_decode_graph_replays_match_eager"
FAULT = "metadata-rebound"


def failing_run(node_id: str, fault: str, backend: str, repro_dir: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "pytest", node_id, "-p", "no:xdist", "-q", f"--graph-backend={backend}",
           "--plant-fault", fault, f"--repro-dir={repro_dir}"]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def scenario_file(tmp_path_factory, graph_backend) -> Path:
    folder = tmp_path_factory.mktemp("repro")
    proc = failing_run(DETECTOR, FAULT, graph_backend.name, folder)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    files = list(folder.glob("*.json"))
    assert [f.name for f in files] == ["suites_model_test_capturable.py__test_decode_graph_replays_match_eager.json"]
    assert f"harness repro {files[0]}" in proc.stdout
    assert f"harness explain {files[0]}" in proc.stdout  # the test recorded a scenario: explainable
    return files[0]


def _without_addresses(report: str) -> str:
    return re.sub(r"0x[0-9a-f]+", "0x?", report)  # fresh tensors each replay, same paths


def replays(path: Path, count: int, capsys, *extra: str) -> list[tuple[int, str]]:
    verdicts = []
    for _ in range(count):
        code = main(["repro", str(path), *extra])
        verdicts.append((code, capsys.readouterr().out))
    return verdicts


def test_the_file_records_the_scenario_fault_and_backend(scenario_file, graph_backend):
    record = load_record(scenario_file)
    assert record.fault == FAULT and record.backend == graph_backend.name
    assert record.scenario is not None and record.scenario.engine["decode_graph_sizes"] == [8]
    assert record.node_id == DETECTOR
    assert expected_diagnosis(graph_backend.name) in record.failure  # the report: replay's test below


def expected_diagnosis(backend: str) -> str:
    # The planted prepare keeps the old metadata alive and rebinds fresh buffers: the graphs read
    # the capture-time metadata and the generations diverge, on every backend.
    return "divergence"


def test_replay_fails_the_same_way_then_passes_without_the_fault(scenario_file, graph_backend, capsys):
    verdicts = replays(scenario_file, 2, capsys)
    assert [code for code, _ in verdicts] == [1, 1]
    assert _without_addresses(verdicts[0][1]) == _without_addresses(verdicts[1][1])
    report = verdicts[0][1]
    assert expected_diagnosis(graph_backend.name) in report
    assert re.search(r"rebound since capture: [^\n]*metadata\.seq_lens", report)
    [(code, report)] = replays(scenario_file, 1, capsys, "--without-fault")
    assert code == 0, report
    assert "compare_generations: ok" in report


def test_explain_of_the_file_names_the_first_read_of_the_rebound_metadata(scenario_file, graph_backend,
                                                                          capsys):
    if graph_backend.name != "emulated":
        pytest.skip("harness explain observes emulated replays; this file was recorded on cuda")
    assert main(["explain", str(scenario_file)]) == 1
    out = capsys.readouterr().out
    assert "first divergent op: aten.index_select.default\n  at harness/model/rope.py:" in out, out
    assert "buffer rebound since capture" in out and "eager reads `metadata.positions`" in out, out


def test_ten_replays_in_a_row_give_the_same_verdict_and_report(scenario_file, capsys):
    verdicts = replays(scenario_file, 10, capsys)
    assert {code for code, _ in verdicts} == {1}
    assert len({_without_addresses(report) for _, report in verdicts}) == 1


@pytest.mark.slow
def test_a_test_without_a_scenario_replays_under_pytest(tmp_path, graph_backend, capsys):
    node = "suites/ops/test_attention.py::test_nan_padding_writes_only_the_pad_sink"
    proc = failing_run(node, "pad-rows-write-real-kv", graph_backend.name, tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [path] = tmp_path.glob("*.json")
    assert load_record(path).scenario is None
    assert main(["repro", str(path)]) == 1
    assert "padded rows wrote real KV slots [0]" in capsys.readouterr().out
    assert main(["repro", str(path), "--without-fault"]) == 0
