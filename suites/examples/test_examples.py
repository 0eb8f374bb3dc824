"""The examples under examples/ are projects of their own; each one's suite must pass as its README
(docs/testing-your-runtime.md) says to run it, with this session's graph backend."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.parent for p in (ROOT / "examples").glob("*/pytest.ini"))
# Examples written only against torch.cuda: without a GPU they run on the emulated CUDA device.
CUDA_ONLY = {"cuda_runtime"}


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_suite_passes(example, request):
    env = dict(os.environ)
    # As if the harness were installed: this checkout first on the path.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "--repro-dir", "none"]
    if example.name in CUDA_ONLY:
        if not _real_cuda():
            command.append("--emulate-cuda")
    else:
        command += ["--graph-backend", request.config.getoption("graph_backend")]
    done = subprocess.run(command, cwd=example, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout


def _real_cuda() -> bool:
    import torch

    from harness.emulation import emulation_active

    return torch.cuda.is_available() and emulation_active() != "cpu"


def test_there_is_an_example():
    assert [p.name for p in EXAMPLES] == ["cuda_runtime", "my_runtime"]
