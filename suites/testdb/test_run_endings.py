"""How a `harness run` ends: a list line naming a missing file is reported and left out while the
rest runs; a signal that comes after every test finished does not make the run "interrupted"."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.testdb import Machine, TestList
from harness.testdb.runner import Invocation, run_list
from harness.testdb.schema import Block, Condition, parse_line
from harness.testdb.summary import Outcome, report

CPU = Machine(gpu_count=0, gpu="", stage="pre_merge", backend="emulated")


def test_a_missing_file_is_reported_and_the_rest_of_its_run_goes_on(tmp_path, capsys):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_here.py").write_text("def test_here():\n    pass\n")
    test_list = TestList("mine", "mine.yml", (Block(Condition(), tuple(
        parse_line(text) for text in ("tests/test_here.py", "tests/test_gone.py"))),))
    code = run_list(test_list, CPU, root=tmp_path, results_dir=tmp_path / "results",
                    extra_args=("-p", "no:cacheprovider"))
    out = capsys.readouterr().out
    assert code == 1, out
    total = next(row.split() for row in out.splitlines() if row.startswith("total "))
    assert total[1:3] == ["1", "0"]  # the file that exists ran and passed
    assert f"[harness] MISSING tests/test_gone.py: no such file or folder under {tmp_path}" in out
    assert ("[harness] FAILED MISSING tests/test_gone.py: no such file or folder; its line was "
            "skipped: tests/test_gone.py") in out
    assert "usage error" not in out


def finished_run(tmp_path: Path, returncode: int, cut: str | None) -> list[Outcome]:
    junit = tmp_path / "1.xml"
    junit.write_text('<testsuite><testcase classname="tests.test_x" name="test_x" time="0.1"/></testsuite>')
    return [Outcome(Invocation((parse_line("tests/test_x.py"),)), returncode, junit, cut=cut)]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_after_every_test_finished_leaves_the_verdict_alone(tmp_path, signum):
    logged = []
    code = report(finished_run(tmp_path, 0, None), test_list=TestList("mine", "m.yml", ()),
                  machine=CPU, root=tmp_path, merged=tmp_path / "mine.xml", wall=1.0,
                  stopped_by=signum, json_path=None, log=logged.append)
    assert code == 0
    assert f"[harness] {signum.name} came after every test had finished; nothing was cut" in logged
    assert logged[-1].startswith("[harness] passed in ")
    assert not any("STOPPED" in line or "interrupted" in line for line in logged)


def test_a_signal_that_cut_a_run_still_stops_it(tmp_path):
    logged = []
    code = report(finished_run(tmp_path, 2, "interrupted"), test_list=TestList("mine", "m.yml", ()),
                  machine=CPU, root=tmp_path, merged=tmp_path / "mine.xml", wall=1.0,
                  stopped_by=signal.SIGINT, json_path=None, log=logged.append)
    assert code == 130 and logged[-1].startswith("[harness] STOPPED by SIGINT")


SIGNALS_ITS_RUNNER = '''
import os, signal


def pytest_sessionfinish(session):
    # Every test has run: Ctrl-C reaches `harness run` now (this process lets it pass).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.kill(os.getppid(), signal.SIGINT)
'''


@pytest.mark.slow  # subprocesses that import torch: nightly_cpu runs it
def test_harness_run_sent_sigint_after_its_tests_finished_says_passed(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("def test_x():\n    pass\n")
    (tmp_path / "conftest.py").write_text(SIGNALS_ITS_RUNNER)
    (tmp_path / "test-db").mkdir()
    (tmp_path / "test-db" / "mine.yml").write_text("version: 1\nmine:\n- tests:\n  - tests\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "run", "mine", "--", "-p", "no:cacheprovider"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[harness] SIGINT came after every test had finished; nothing was cut" in proc.stdout
    assert "interrupted" not in proc.stdout and "STOPPED" not in proc.stdout


def test_a_run_prints_one_junit_path_the_merged_file(tmp_path, capfd):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("def test_x():\n    pass\n")
    test_list = TestList("mine", "mine.yml", (Block(Condition(), (parse_line("tests"),)),))
    assert run_list(test_list, CPU, root=tmp_path, results_dir=tmp_path / "results",
                    extra_args=("-p", "no:cacheprovider")) == 0
    out = capfd.readouterr().out
    assert "generated xml file" not in out, out
    # Besides the command each run echoes (its --junitxml part), one path: the merged file.
    assert [line for line in out.splitlines() if ".xml" in line and not line.startswith("[harness] run ")] == [
        f"[harness] JUnit XML: {tmp_path / 'results' / 'mine.xml'}"]
    assert (tmp_path / "results" / "mine" / "1.xml").is_file()  # the part is still written


def test_harness_names_an_unknown_flag_before_the_verb(capsys):
    from harness.cli import main

    assert main(["--bogus"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("harness: unknown option --bogus; a verb comes first: harness VERB"), err
    assert "run, testdb" in err and "\n" not in err
