"""A foreign torch project, with the harness installed, runs as if the harness were not: its own
conftest, options and fixtures named like the harness's might be (`engine`, `backend`, `device`),
its own `gpu`/`slow` markers, a `torch.cuda` skipif on a machine without CUDA, under xdist. The
plugin loads through its entry point in the controller and in every worker; the project's results,
its torch state and its warnings must equal those of the same run with `-p no:harness`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

THEIR_INI = """[pytest]
addopts = --strict-markers -p no:cacheprovider
markers =
    gpu: theirs, not the harness's
    slow: theirs too
filterwarnings = error
"""

THEIR_CONFTEST = '''
import json, os, sys
import pytest


def pytest_addoption(parser):
    parser.addoption("--backend", default="eager", choices=("eager", "compiled"))
    parser.addoption("--engine", default="tiny")
    parser.addoption("--device", default="cpu")
    parser.addoption("--runslow", action="store_true")


@pytest.fixture
def backend(request):
    return "their-" + request.config.getoption("backend")


@pytest.fixture
def engine(request, backend):
    return {"name": request.config.getoption("engine"), "backend": backend}


@pytest.fixture
def device(request):
    return request.config.getoption("device")


def pytest_collection_modifyitems(config, items):
    if not config.getoption("runslow"):
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(pytest.mark.skip(reason="their slow"))


def torch_state():
    import torch
    return {"threads": torch.get_num_threads(), "dtype": str(torch.get_default_dtype()),
            "grad": torch.is_grad_enabled(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "cuda_available": torch.cuda.is_available(),
            "cuda_initialized": torch.cuda.is_initialized(),
            "version_cuda": torch.version.cuda, "device_count": torch.cuda.device_count(),
            "function_modes": torch._C._is_torch_function_mode_enabled(),
            "dispatch_modes": torch._C._len_torch_dispatch_stack(),
            "factory_device": str(torch.empty(0).device),
            "emulation_imported": "harness.emulation" in sys.modules}


def pytest_sessionfinish(session):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    with open(os.path.join(os.environ["THEIR_REPORT"], worker + ".json"), "w") as out:
        json.dump(torch_state() if "torch" in sys.modules else None, out, sort_keys=True)
'''

THEIR_TESTS = '''
import json, os
import pytest
import torch
from conftest import torch_state


def test_their_fixtures(engine, backend, device):
    assert engine == {"name": "tiny", "backend": "their-eager"}
    assert (backend, device) == ("their-eager", "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu():
    assert torch.ones(1, device="cuda").is_cuda


@pytest.mark.gpu
def test_their_gpu_marker_is_theirs():
    assert torch.ones(1).sum().item() == 1.0


@pytest.mark.slow
def test_their_slow():
    pass


@pytest.mark.parametrize("n", [1, 2])
def test_torch_state_inside_a_test(n):
    with open(os.path.join(os.environ["THEIR_REPORT"], f"test{n}.json"), "w") as out:
        json.dump(torch_state(), out, sort_keys=True)
'''


@pytest.fixture
def their_project(tmp_path) -> Path:
    project = tmp_path / "theirs"
    project.mkdir()
    (project / "pytest.ini").write_text(THEIR_INI)
    (project / "conftest.py").write_text(THEIR_CONFTEST)
    (project / "test_theirs.py").write_text(THEIR_TESTS)
    return project


def _other_plugins() -> list[str]:
    """The pytest11 entry points installed here other than ours and xdist (which the runs use)."""
    from importlib.metadata import entry_points

    keep = {"harness", "xdist", "xdist.looponfail"}
    return sorted({e.name for e in entry_points(group="pytest11")} - keep)


def _run(project: Path, report: Path, *args: str) -> dict:
    report.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "THEIR_"))}
    # As if the harness were installed here: the checkout on the path, the venv's editable
    # install loading the plugin through its pytest11 entry point.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["THEIR_REPORT"] = str(report)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-q", "--engine", "tiny", *args],
                          cwd=project, env=env, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    outcomes = sorted(re.findall(r"^(PASSED \S+|SKIPPED \[\d+\] \S+ .*|FAILED \S+|ERROR \S+)$", output, re.M))
    states = {p.stem: json.loads(p.read_text()) for p in sorted(report.glob("*.json"))}
    return {"rc": proc.returncode, "outcomes": outcomes, "states": states,
            "warned": "warning" in output.lower(), "output": output}


def _compare_with_and_without_the_plugin(project: Path, tmp_path: Path, *args: str) -> None:
    # Other installed plugins stay out of both runs (pytest-benchmark, where installed, warns
    # under xdist, and the project turns warnings into errors): only ours differs between them.
    others = [f"-p no:{name}" for name in _other_plugins()]
    others = [part for option in others for part in option.split(" ", 1)]
    guest = _run(project, tmp_path / "with", *others, *args)
    alone = _run(project, tmp_path / "without", *others, "-p", "no:harness", *args)
    assert alone["rc"] == 0 and not alone["warned"], alone["output"]  # the project itself is sound
    assert len(alone["outcomes"]) == 6 and "test1" in alone["states"], alone["output"]
    for key in ("rc", "outcomes", "states", "warned"):
        assert guest[key] == alone[key], f"{key} differs with the harness installed:\n{guest['output']}"


def test_a_torch_project_under_xdist_runs_as_without_the_harness(their_project, tmp_path):
    _compare_with_and_without_the_plugin(their_project, tmp_path, "-p", "xdist", "-n", "2")


@pytest.mark.slow
def test_a_torch_project_runs_as_without_the_harness(their_project, tmp_path):
    _compare_with_and_without_the_plugin(their_project, tmp_path)
