"""The `harness` command line: testdb render/lists, bench dispatch, and errors as exit codes."""

import sys

import pytest

import harness.bench
from harness.cli import main

LISTS = """
version: 0.0.1
l0_demo:
- condition:
    ranges: {gpu_count: {gte: 1}}
    wildcards: {gpu: '*h200*'}
  tests:
  - suites/ops -m "not slow"
- condition:
    terms: {stage: nightly}
  tests:
  - suites/e2e TIMEOUT (600)
"""


@pytest.fixture
def testdb(tmp_path):
    (tmp_path / "lists.yml").write_text(LISTS)
    return str(tmp_path)


def test_render_prints_the_lines_for_the_given_machine(testdb, capsys):
    assert main(["testdb", "render", "l0_demo", "--test-db", testdb, "--gpu-count", "2", "--gpu", "NVIDIA H200",
                 "--stage", "nightly"]) == 0
    assert capsys.readouterr().out == 'suites/ops -m "not slow"\nsuites/e2e TIMEOUT (600)\n'
    # Selecting nothing means what it means for `harness run`: exit 2.
    assert main(["testdb", "render", "l0_demo", "--test-db", testdb, "--gpu-count", "2", "--gpu", "NVIDIA A10"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "selects no tests for gpu_count=2 gpu='NVIDIA A10'" in captured.err


def test_lists_names_each_list_and_its_file(testdb, capsys):
    assert main(["testdb", "lists", "--test-db", testdb]) == 0
    assert capsys.readouterr().out.startswith("l0_demo  (")


def test_a_bad_list_file_is_exit_code_2_with_the_loader_message(tmp_path, capsys):
    (tmp_path / "bad.yml").write_text("version: 1\nl0_bad:\n- condition: {ranges: {gpu_count: {gte: 2, lte: 1}}}\n"
                                      "  tests: [suites/ops]\n")
    assert main(["testdb", "render", "l0_bad", "--test-db", str(tmp_path)]) == 2
    assert "list 'l0_bad', block 1: condition.ranges.gpu_count: gte 2 > lte 1" in capsys.readouterr().err


def test_run_of_an_unknown_list_names_the_available_ones(testdb, capsys):
    assert main(["run", "l0_typo", "--test-db", testdb, "--", "-x"]) == 2
    assert "no test-db list named 'l0_typo'" in capsys.readouterr().err


@pytest.fixture
def planted_bench(tmp_path, monkeypatch):
    (tmp_path / "planted.py").write_text(
        "def main(argv):\n    print('planted bench got', argv)\n    return 3 if argv == ['--fail'] else 0\n")
    monkeypatch.setattr(harness.bench, "__path__", [*harness.bench.__path__, str(tmp_path)])
    yield
    sys.modules.pop("harness.bench.planted", None)


def test_bench_imports_the_module_and_returns_its_exit_code(planted_bench, capsys):
    assert main(["bench", "planted", "--iters", "5"]) == 0
    assert "planted bench got ['--iters', '5']" in capsys.readouterr().out
    assert main(["bench", "planted", "--fail"]) == 3


def test_unknown_bench_is_an_error_listing_the_available_ones(planted_bench, capsys):
    assert main(["bench", "no_such_bench"]) == 2
    err = capsys.readouterr().err
    assert "unknown benchmark 'no_such_bench'; available:" in err
    assert "planted" in err

