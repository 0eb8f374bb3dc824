"""The pytest plugin in a project that does not use the harness: it must change nothing there (the
user's Hypothesis profile, no torch import, no reproduction files, torch's thread count)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FOREIGN_CONFTEST = '''
import json, os, sys
from hypothesis import settings

settings.register_profile("mine", max_examples=7, derandomize=False)
settings.load_profile("mine")


def pytest_sessionfinish(session):
    with open(os.environ["GUEST_REPORT"], "w") as out:
        json.dump({"torch_imported": "torch" in sys.modules}, out)
'''

FOREIGN_TEST = '''
import os
from hypothesis import given, settings, strategies as st


def test_profile_is_mine():
    current = settings()
    print(f"PROFILE={settings.get_current_profile_name()} MAX_EXAMPLES={current.max_examples} "
          f"DERANDOMIZE={current.derandomize}")
    assert (current.max_examples, current.derandomize) == (7, False)


@given(st.integers())
def test_property_runs_under_my_profile(n):
    pass


def test_fails_on_request():
    assert not os.environ.get("GUEST_FAIL"), "a planted failure of a foreign project"
'''


def foreign_pytest(project: Path, *args: str, fail: bool = False) -> tuple[subprocess.CompletedProcess, dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GUEST_"))}
    # As if the harness were installed into this environment: its checkout first on the path (the
    # venv's editable install loads the plugin through its pytest11 entry point).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["GUEST_REPORT"] = str(project / "guest.json")
    if fail:
        env["GUEST_FAIL"] = "1"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
           "-s", "-q", *args]
    proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    return proc, json.loads((project / "guest.json").read_text())


@pytest.fixture
def foreign_project(tmp_path) -> Path:
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers\n")
    (tmp_path / "conftest.py").write_text(FOREIGN_CONFTEST)
    (tmp_path / "test_theirs.py").write_text(FOREIGN_TEST)
    return tmp_path


def test_a_foreign_session_keeps_its_profile_and_imports_no_torch(foreign_project):
    proc, report = foreign_pytest(foreign_project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PROFILE=mine MAX_EXAMPLES=7 DERANDOMIZE=False" in proc.stdout
    assert report == {"torch_imported": False}
    assert not (foreign_project / "repro").exists()


def test_a_failing_foreign_test_writes_no_reproduction_file(foreign_project):
    proc, report = foreign_pytest(foreign_project, fail=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "a planted failure of a foreign project" in proc.stdout
    assert "harness repro" not in proc.stdout
    assert report == {"torch_imported": False}
    assert list(foreign_project.rglob("*.json")) == [foreign_project / "guest.json"]


def test_a_foreign_session_that_names_a_harness_option_uses_the_harness(foreign_project):
    proc, report = foreign_pytest(foreign_project, "--graph-backend", "emulated", fail=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "PROFILE=mine MAX_EXAMPLES=7" in proc.stdout  # the profile the project loaded still wins
    assert "harness repro" in proc.stdout
    assert [p.name for p in (foreign_project / "repro").iterdir()] == ["test_theirs.py__test_fails_on_request.json"]


def test_importing_the_plugin_imports_no_torch():
    code = "import sys, harness, harness.pytest_plugin, harness.cli; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr[-3000:]
    assert " torch\n" not in proc.stderr  # -X importtime lists every module imported
