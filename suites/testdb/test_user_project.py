"""`harness run` and `harness testdb check` on a user's own project: no pyproject.toml, lists in a
folder of its own, tests outside `suites/`. The root comes from the lists' location; the summary
names the failing tests, their reproduction files and the skips by reason, also as JSON."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main

USER_TESTS = '''
import pytest


def test_passes():
    pass


def test_fails():
    assert 1 + 1 == 3


@pytest.mark.skip(reason="not on this machine")
def test_skipped_once():
    pass


@pytest.mark.skip(reason="not on this machine")
def test_skipped_twice():
    pass
'''

LISTS = """
version: 0.0.1
mine:
- tests:
  - tests/unit
"""


@pytest.fixture
def user_project(tmp_path) -> Path:
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "test_mine.py").write_text(USER_TESTS)
    (tmp_path / "ci" / "test-db").mkdir(parents=True)
    (tmp_path / "ci" / "test-db" / "mine.yml").write_text(LISTS)
    return tmp_path


def harness_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_run_of_a_users_list_is_rooted_at_its_project_and_summarises_for_ci(user_project):
    project = user_project
    proc = harness_cli(project, "run", "mine", "--test-db", "ci/test-db", "--rootdir", ".",
                       "--json", "out/run.json", "--", "-p", "no:cacheprovider")
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert f"rooted at {project}" in out
    assert (project / "results" / "mine.xml").is_file()
    assert "[harness] failed (1):\n  tests/unit/test_mine.py::test_fails" in out
    repro = project / "repro" / "tests_unit_test_mine.py__test_fails.json"
    assert f"[harness] reproduction files (1):\n  harness repro {repro}" in out
    assert "[harness] skipped, by reason:\n      2  not on this machine" in out

    document = json.loads((project / "out" / "run.json").read_text())
    assert document["exit_code"] == 1 and document["root"] == str(project)
    assert document["suites"]["tests"] == {"suite": "tests", "passed": 1, "failed": 1, "skipped": 2,
                                           "seconds": document["suites"]["tests"]["seconds"]}
    assert document["failed"] == ["tests/unit/test_mine.py::test_fails"]
    assert document["reproductions"] == [str(repro)]
    assert document["skipped_by_reason"] == {"not on this machine": 2}
    assert document["stopped_by"] is None and document["cut"] == []


def test_the_root_defaults_to_the_folder_holding_the_lists(user_project, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (user_project / "test-db").mkdir()
    (user_project / "test-db" / "mine.yml").write_text(LISTS)
    proc = harness_cli(elsewhere, "run", "mine", "--test-db", str(user_project / "test-db"),
                       "--", "-p", "no:cacheprovider", "-k", "passes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"rooted at {user_project}" in proc.stdout
    assert (user_project / "results" / "mine.xml").is_file() and not (elsewhere / "results").exists()


def test_testdb_check_collects_the_folders_the_lists_name(user_project, capsys):
    (user_project / "tests" / "other").mkdir()
    (user_project / "tests" / "other" / "test_forgotten.py").write_text("def test_in_no_list():\n    pass\n")
    args = ["testdb", "check", "--test-db", str(user_project / "ci" / "test-db"), "--rootdir", str(user_project)]
    assert main(args) == 1
    assert capsys.readouterr().out.strip() == "test in no list: tests/other/test_forgotten.py::test_in_no_list"
    (user_project / "ci" / "test-db" / "mine.yml").write_text(LISTS + "  - tests/other\n")
    assert main(args) == 0
    assert "every list line names existing tests" in capsys.readouterr().out
