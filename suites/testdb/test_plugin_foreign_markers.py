"""A foreign project with markers of its own named like the harness's (`slow`, `gpu`) and a failing
test: with the harness installed its session is byte for byte what it is with the plugin blocked
(`-p no:harness`), no file written, no torch imported, no test skipped. The harness's own markers
(`harness_gpu`...) still act there: they are in its namespace."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FOREIGN_INI = """[pytest]
addopts = --strict-markers
markers =
    slow: this project's own slow tests
    gpu: this project's own meaning of gpu (a GPU-shaped fake, no CUDA needed)
"""

FOREIGN_CONFTEST = '''
import json, os, sys


def pytest_unconfigure(config):
    with open(os.environ["GUEST_REPORT"], "w") as out:
        json.dump({"torch_imported": "torch" in sys.modules}, out)
'''

FOREIGN_TESTS = '''
import pytest


@pytest.mark.slow
def test_slow_and_failing():
    assert 1 + 1 == 3, "a planted failure of a foreign project"


@pytest.mark.gpu
def test_their_gpu_runs_without_cuda():
    pass


def test_plain():
    pass
'''

HARNESS_MARKED = '''
import pytest


@pytest.mark.harness_gpu
def test_needs_real_cuda():
    pass
'''


def run_foreign(project: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GUEST_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["GUEST_REPORT"] = str(project.parent / f"{project.name}.report.json")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rA", *args]
    proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    return proc, json.loads(Path(env["GUEST_REPORT"]).read_text())


def comparable(text: str, project: Path) -> str:
    """The session's text less what differs between any two runs: the plugin list of the header
    (it names the installed harness whether loaded or not), the folder, the duration."""
    text = text.replace(str(project), "<project>")
    text = re.sub(r"^plugins: .*$", "plugins: ...", text, flags=re.MULTILINE)
    return re.sub(r" in \d+\.\d+s", " in <t>s", text)


def tree(project: Path) -> dict[str, bytes]:
    return {str(p.relative_to(project)): p.read_bytes() for p in sorted(project.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture
def foreign_projects(tmp_path) -> tuple[Path, Path]:
    first = tmp_path / "with_harness"
    first.mkdir()
    (first / "pytest.ini").write_text(FOREIGN_INI)
    (first / "conftest.py").write_text(FOREIGN_CONFTEST)
    (first / "test_theirs.py").write_text(FOREIGN_TESTS)
    second = tmp_path / "without_harness"
    shutil.copytree(first, second)
    return first, second


def test_a_foreign_session_with_its_own_slow_and_gpu_markers_is_unchanged(foreign_projects):
    with_harness, without = foreign_projects
    proc, report = run_foreign(with_harness)
    blocked, blocked_report = run_foreign(without, "-p", "no:harness")
    assert blocked.returncode == 1, blocked.stdout + blocked.stderr
    assert "harness" not in blocked.stdout.replace(str(without), "")  # the plugin really was out
    assert proc.returncode == blocked.returncode
    assert comparable(proc.stdout, with_harness) == comparable(blocked.stdout, without)
    assert comparable(proc.stderr, with_harness) == comparable(blocked.stderr, without)
    assert "PASSED test_theirs.py::test_their_gpu_runs_without_cuda" in proc.stdout
    assert "SKIPPED" not in proc.stdout
    assert report == blocked_report == {"torch_imported": False}
    assert tree(with_harness) == tree(without)  # no repro/ folder, nothing else written


@pytest.mark.slow  # subprocesses that import torch: nightly_cpu runs it
def test_the_harness_gpu_marker_acts_in_a_foreign_project(foreign_projects):
    project, _ = foreign_projects
    (project / "test_marked.py").write_text(HARNESS_MARKED)
    proc, _ = run_foreign(project, "test_marked.py")
    import torch

    if torch.cuda.is_available():
        assert "PASSED test_marked.py::test_needs_real_cuda" in proc.stdout, proc.stdout
    else:
        assert "SKIPPED [1] test_marked.py:5: needs CUDA" in proc.stdout, proc.stdout
