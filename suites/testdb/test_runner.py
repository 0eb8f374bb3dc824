"""`harness run`: planning pytest processes, xdist sizing, timeouts, and a run of a planted project."""

import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest

from harness.testdb import Condition, Machine, TestDbError, TestList, parse_line
from harness.testdb.runner import (
    HANDFUL, Invocation, estimate_test_count, execute, plan, pytest_command, run_list, worker_count,
)
from harness.testdb.schema import Block

CPU = Machine(gpu_count=0, gpu="", stage="pre_merge", backend="emulated")


def lines(*texts):
    return [parse_line(t) for t in texts]


def test_plan_groups_lines_by_filters_and_isolates_timeouts():
    invocations = plan(lines('a -m "not slow"', "b", 'c -m "not slow"', "d TIMEOUT (9)", "e -k x"))
    assert [([l.test for l in inv.lines], inv.keyword, inv.marker, inv.timeout) for inv in invocations] == [
        (["a", "c"], None, "not slow", None),
        (["b"], None, None, None),
        (["e"], "x", None, None),
        (["d"], None, None, 9),
    ]


@pytest.mark.parametrize("tests, cpus, workers", [
    (100, 1, 0),  # one CPU: workers only add start-up
    (HANDFUL, 8, 0),  # a handful of tests: not worth a torch import per worker
    (HANDFUL + 1, 2, 2),
    (HANDFUL + 1, 64, HANDFUL + 1),  # never more workers than tests
])
def test_worker_count(tests, cpus, workers):
    assert worker_count(tests, cpus) == workers


def test_estimate_counts_test_functions_without_collecting(tmp_path):
    (tmp_path / "s" / "sub").mkdir(parents=True)
    (tmp_path / "s" / "test_a.py").write_text("def test_1(): pass\nasync def test_2(): pass\ndef helper(): pass\n")
    (tmp_path / "s" / "sub" / "test_b.py").write_text("class TestX:\n    def test_3(self): pass\n")
    (tmp_path / "s" / "notes.py").write_text("def test_not_collected(): pass\n")
    assert estimate_test_count(tuple(lines("s")), tmp_path) == 3
    assert estimate_test_count(tuple(lines("s/test_a.py", "s/sub/test_b.py::TestX::test_3")), tmp_path) == 3


def test_pytest_command_carries_backend_filters_and_workers(tmp_path):
    inv = Invocation(tuple(lines("a", "b")), keyword="k1", marker="not slow")
    cmd = pytest_command(inv, backend="emulated", junit=tmp_path / "1.xml", workers=2, extra_args=("-x",))
    assert cmd[:3] == [sys.executable, "-m", "pytest"]
    assert cmd[3:] == ["a", "b", "--graph-backend=emulated", f"--junitxml={tmp_path / '1.xml'}",
                       "--junit-part-of-run", "-k", "k1", "-m", "not slow", "-n", "2", "-x"]
    assert "-n" not in pytest_command(inv, backend="cuda", junit=tmp_path / "1.xml", workers=0)


def test_execute_kills_a_process_past_its_timeout(tmp_path):
    hang = [sys.executable, "-c", "import threading; threading.Event().wait()"]
    assert execute(hang, cwd=tmp_path, timeout=0.5) is None
    assert execute([sys.executable, "-c", "raise SystemExit(3)"], cwd=tmp_path, timeout=30) == 3


DEMO_TESTS = '''
import threading
import pytest

def test_passes():
    assert 1 + 1 == 2

def test_fails():
    assert 1 + 1 == 3

@pytest.mark.skip(reason="planted skip")
def test_skipped():
    pass

@pytest.mark.slow
def test_slow_is_filtered_out():
    assert False, "the -m filter of the line should have deselected this"
'''


def test_run_list_runs_a_planted_project_and_reports_per_suite(tmp_path, capsys):
    (tmp_path / "suites" / "demo").mkdir(parents=True)
    (tmp_path / "suites" / "demo" / "test_demo.py").write_text(textwrap.dedent(DEMO_TESTS))
    (tmp_path / "suites" / "hang").mkdir(parents=True)
    (tmp_path / "suites" / "hang" / "test_hang.py").write_text(
        "import threading\ndef test_hangs():\n    threading.Event().wait()\n")
    test_list = TestList("demo", "demo.yml", (Block(Condition(), tuple(lines(
        'suites/demo -m "not slow"', "suites/hang TIMEOUT (1)"))),))

    code = run_list(test_list, CPU, root=tmp_path, results_dir=tmp_path / "results")

    out = capsys.readouterr().out
    assert code == 1
    rows = {row.split()[0]: row.split()[1:] for row in out.splitlines() if row.startswith(("demo ", "hang ", "total "))}
    assert rows["demo"][:3] == ["1", "1", "1"]  # passed, failed, skipped
    assert rows["hang"][:3] == ["0", "1", "0"]  # the timeout, as a failure
    assert "FAILED TIMEOUT after 1 s: suites/hang TIMEOUT (1)" in out
    merged = tmp_path / "results" / "demo.xml"
    assert f"JUnit XML: {merged}" in out
    assert len(list(ET.parse(merged).getroot().iter("testcase"))) == 3


def test_run_list_refuses_a_list_that_selects_nothing(tmp_path):
    test_list = TestList("gpu_only", "g.yml", (Block(Condition(terms=(("backend", ("cuda",)),)), tuple(lines("s"))),))
    with pytest.raises(TestDbError, match="selects no tests for gpu_count=0"):
        run_list(test_list, CPU, root=tmp_path, results_dir=tmp_path / "results")
