"""The emulated device of a pytest session, set by options and ini keys (the command line wins),
and the refusals of device options that do not apply in the session, each one line naming it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

REPORTS_DEVICE = '''
import json, os
import torch


def test_reports_the_device():
    free, total = torch.cuda.mem_get_info()
    props = torch.cuda.get_device_properties(0)
    x = torch.ones(4, device="cuda")
    with open(os.environ["DEVICE_REPORT"], "w") as out:
        json.dump({"total": total, "properties_total": props.total_memory, "name": props.name,
                   "count": torch.cuda.device_count(), "device": str(x.device)}, out)
'''


def run_pytest(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["DEVICE_REPORT"] = str(project / "device.json")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
           "--repro-dir", "none", *args]
    return subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def project(tmp_path) -> Path:
    (tmp_path / "test_device.py").write_text(REPORTS_DEVICE)
    return tmp_path


def without_cuda():
    import torch

    from harness.emulation import emulation_active

    if torch.cuda.is_available() or emulation_active() is not None:
        pytest.skip("the emulated device is what runs without CUDA, from a session outside it")


def test_command_line_options_size_name_and_count_the_emulated_device(project):
    without_cuda()
    proc = run_pytest(project, "--emulate-cuda", "--emulate-cuda-memory", "8GiB",
                      "--emulate-cuda-name", "Tiny GPU", "--emulate-cuda-count", "2",
                      "--cuda-schedule", "adversarial")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((project / "device.json").read_text())
    assert report == {"total": 8 * 1024**3, "properties_total": 8 * 1024**3, "name": "Tiny GPU",
                      "count": 2, "device": "cuda:0"}


def test_xdist_workers_take_the_device_options_under_the_inherited_emulation(project):
    """An xdist worker enters the controller's emulated device as it imports torch, so torch.cuda
    says a device is there; the options were refused as if the worker had a real GPU."""
    without_cuda()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["DEVICE_REPORT"] = str(project / "device.json")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "1", "-q",
           "--repro-dir", "none", "--emulate-cuda", "--emulate-cuda-count", "2",
           "--cuda-schedule", "adversarial"]
    proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((project / "device.json").read_text())["count"] == 2


@pytest.mark.slow  # subprocesses that import torch: nightly_cpu runs it
def test_ini_keys_set_the_device_and_the_command_line_wins(project):
    without_cuda()
    (project / "pytest.ini").write_text("[pytest]\nemulate_cuda = true\nemulate_cuda_memory = 4GiB\n"
                                        "cuda_schedule = adversarial\n")
    proc = run_pytest(project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((project / "device.json").read_text())["total"] == 4 * 1024**3
    proc = run_pytest(project, "--emulate-cuda-memory", "512MiB")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((project / "device.json").read_text())["total"] == 512 * 1024**2


@pytest.mark.parametrize("args, message", [
    (("--cuda-schedule", "adversarial"),
     "ERROR: --cuda-schedule adversarial: applies only to the emulated CUDA device, and this session "
     "does not run under it; add --emulate-cuda"),
    (("--emulate-cuda-memory", "8GiB"),
     "ERROR: --emulate-cuda-memory 8GiB: applies only to the emulated CUDA device"),
    (("--cuda-races", "off"), "ERROR: --cuda-races off: applies only to the emulated CUDA device"),
    (("--emulate-cuda", "--emulate-cuda-memory", "8 gigs"),
     "ERROR: --emulate-cuda-memory '8 gigs': not a size; expected a number and one of B, KiB"),
    (("--emulate-cuda", "--emulate-cuda-count", "0"),
     "ERROR: --emulate-cuda-count '0': expected 1 or more devices"),
], ids=["schedule", "memory", "races", "bad-size", "bad-count"])
def test_a_device_option_that_does_not_apply_is_a_one_line_usage_error(project, args, message):
    proc = run_pytest(project, *args)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith(message), proc.stderr


def test_on_a_gpu_the_emulated_device_options_are_refused(project):
    # The session sees a GPU (the conftest says so, as torch would on one): --emulate-cuda is the
    # graph sanitizer there, and a schedule for the emulated device's streams would do nothing.
    (project / "conftest.py").write_text("import torch\ntorch.cuda.is_available = lambda: True\n")
    proc = run_pytest(project, "--emulate-cuda", "--cuda-schedule", "adversarial")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert proc.stderr.strip().startswith(
        "ERROR: --cuda-schedule adversarial: this machine has CUDA, so --emulate-cuda runs the graph "
        "sanitizer on the real GPU"), proc.stderr


SEES_A_GPU_AND_RECORDS_THE_EMULATION = '''
import json, os
import torch
import harness

torch.cuda.is_available = lambda: True


def recorded(**kwargs):  # stands in for the graph sanitizer, which needs a real GPU
    with open(os.environ["DEVICE_REPORT"], "w") as out:
        json.dump(kwargs, out)
    raise SystemExit("recorded")


harness.emulate_cuda = recorded
'''


@pytest.mark.parametrize("source", ["command line", "ini"])
def test_on_a_gpu_the_races_mode_reaches_the_graph_sanitizer(project, source):
    # PyTorch's test_graph_three_successive asserts the values CUDA reads from pool memory another
    # graph overwrote: its runs under the sanitizer need races=report (scripts/pytorch_graph_tests.sh).
    (project / "conftest.py").write_text(SEES_A_GPU_AND_RECORDS_THE_EMULATION)
    if source == "ini":
        (project / "pytest.ini").write_text("[pytest]\ncuda_races = report\ncuda_schedule = adversarial\n")
        args = ("--emulate-cuda",)
    else:
        args = ("--emulate-cuda", "--cuda-races", "report")
    proc = run_pytest(project, *args)
    assert (project / "device.json").exists(), proc.stdout + proc.stderr
    entered = json.loads((project / "device.json").read_text())
    assert entered["races"] == "report" and entered["schedule"] == "issue_order", entered
