"""The pytest plugin, exercised in planted projects run by a pytest subprocess."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.pytest_plugin import check_backend_option

ROOT = Path(__file__).resolve().parents[2]

PLANTED_TESTS = '''
import json
import os
import pytest
import torch
from hypothesis import settings


@pytest.mark.gpu
def test_needs_cuda():
    assert torch.cuda.is_available()


def test_hypothesis_profile():
    profile = settings.get_current_profile_name()
    print(f"PROFILE={profile} MAX_EXAMPLES={settings().max_examples} DERANDOMIZE={settings().derandomize}")
    assert profile == os.environ["EXPECT_PROFILE"]


def test_torch_threads():
    if os.environ.get("EXPECT_XDIST_WORKER"):
        assert os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw")
        assert torch.get_num_threads() == 1


def test_fixture_from_fixtures_folder(planted_fixture):
    assert planted_fixture == "from fixtures/planted.py"


@pytest.mark.slow
@pytest.mark.multirank
@pytest.mark.property
def test_markers_are_registered():
    pass
'''


def run_pytest(project: Path, *args: str, **expect: str) -> subprocess.CompletedProcess:
    """Run pytest in `project`; `expect` sets EXPECT_* variables the planted tests check."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "EXPECT_"))}
    env["EXPECT_PROFILE"] = "ci"
    env.update({f"EXPECT_{key.upper()}": value for key, value in expect.items()})
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--strict-markers", "-rs", "-s", *args]
    return subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A project using the harness (its ini setting), with the repository's root conftest.py and one
    fixture module in fixtures/."""
    root = tmp_path_factory.mktemp("planted")
    shutil.copy(ROOT / "conftest.py", root / "conftest.py")
    (root / "pytest.ini").write_text("[pytest]\naddopts = --import-mode=importlib\npythonpath = .\n"
                                     "capture_harness = true\n")
    (root / "fixtures").mkdir()
    (root / "fixtures" / "__init__.py").write_text("")
    (root / "fixtures" / "planted.py").write_text(
        "import pytest\n\n@pytest.fixture\ndef planted_fixture():\n    return 'from fixtures/planted.py'\n")
    (root / "test_planted.py").write_text(PLANTED_TESTS)
    return root


def test_defaults_ci_profile_gpu_skip_markers_and_fixture_modules(project):
    proc = run_pytest(project)
    out = proc.stdout
    assert "PROFILE=ci MAX_EXAMPLES=25 DERANDOMIZE=True" in out
    import torch

    if torch.cuda.is_available():
        assert proc.returncode == 0, out
    else:
        assert "needs CUDA: torch.cuda.is_available() is False" in out
        assert "4 passed, 1 skipped" in out, out


@pytest.mark.slow  # pytest with xdist workers in a subprocess: nightly_cpu runs it
def test_profile_option_wins_and_xdist_workers_get_one_thread(project):
    proc = run_pytest(project, "--hypothesis-profile", "nightly", "-n", "1", "-k", "profile or threads",
                      profile="nightly", xdist_worker="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout


def test_cuda_backend_without_cuda_is_a_usage_error_naming_the_option():
    with pytest.raises(pytest.UsageError, match="--graph-backend cuda needs CUDA"):
        check_backend_option("cuda", cuda_available=False)
    check_backend_option("cuda", cuda_available=True)
    check_backend_option("auto", cuda_available=False)


def test_markers_are_registered_with_descriptions(pytestconfig):
    registered = {line.split(":")[0]: line for line in pytestconfig.getini("markers")}
    for name in ("gpu", "multirank", "slow", "property"):
        assert name in registered and len(registered[name]) > len(name) + 5


def test_graph_backend_fixture_follows_the_option(graph_backend, device, pytestconfig):
    import torch

    option = pytestconfig.getoption("graph_backend")
    expected = {"auto": "cuda" if torch.cuda.is_available() else "emulated"}.get(option, option)
    assert graph_backend.name == expected
    assert device == torch.device(graph_backend.device)


@pytest.mark.slow  # pytest with xdist workers in a subprocess: nightly_cpu runs it
def test_a_planted_fault_counts_the_firings_of_xdist_workers(tmp_path):
    """Workers plant the fault and fire it; the controller's summary and report add their counts."""
    report = tmp_path / "fault.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    cmd = [sys.executable, "-m", "pytest", "suites/ops/test_attention.py", "-k", "nan_padding", "-n", "2",
           "--plant-fault", "pad-rows-write-real-kv", "--graph-backend", "emulated", "--repro-dir", "none",
           "--fault-report", str(report), "-p", "no:cacheprovider", "-q"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    document = json.loads(report.read_text())
    assert proc.returncode == 1 and document["exitstatus"] == 1, proc.stdout[-3000:]
    assert document["fired"] > 0
    assert f"planted fault pad-rows-write-real-kv: fired {document['fired']} times" in proc.stdout
