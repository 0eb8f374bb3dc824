"""Where a result came from: the checkout, its commit, the machine and the versions. One definition
for the benchmarks, the audit and the fault table.

`checkout_root()` is the checkout this package is imported from (the folder holding `harness/` and
`suites/`): the harness's own detectors, docs and git history are those of the code that runs,
wherever the command was started. (The project whose test-db lists a run uses, the user's, is
`harness.testdb.project_root`: the nearest folder with a test-db/ at or above the working directory.)
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path


def checkout_root() -> Path:
    return Path(__file__).resolve().parents[1]


def git_commit(root: Path | None = None) -> str:
    """Short hash of HEAD of the checkout, with "+dirty" for uncommitted changes to tracked files;
    "uncommitted" where there is no git history."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root or checkout_root()), *args], capture_output=True,
                              text=True, check=True, timeout=30).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return "uncommitted"
    try:
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        dirty = False
    return f"{commit}+dirty" if dirty else commit


def device_name(backend: str = "auto") -> str:
    """The accelerator a "cuda" run used (or, for "auto", the first CUDA device when there is one),
    else the CPU."""
    import torch

    if backend != "emulated" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return platform.processor() or platform.machine() or "cpu"


def machine_line(threads: int | None = None) -> str:
    """One line naming the machine, its cores and CUDA device, the torch threads (`threads`: the
    count a result was timed with; default the current count) and the versions."""
    import torch

    gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    count = f"timed with {threads}" if threads is not None else str(torch.get_num_threads())
    return (f"machine: {platform.platform()}, {os.cpu_count()} cores ({count} torch threads){gpu}, "
            f"python {platform.python_version()}, torch {torch.__version__}")


def versions() -> dict[str, str]:
    """python, torch and (when installed) transformers versions."""
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import transformers
    except ImportError:
        return found
    return {**found, "transformers": transformers.__version__}


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
