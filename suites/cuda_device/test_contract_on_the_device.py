"""The graph contract (suites/graphs) on the emulated CUDA device: the whole folder under
`--emulate-cuda`, where every backend captures through torch.cuda.graph on "cuda" tensors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.emulation import emulation_active

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a pytest or torch.compile subprocess: nightly_cpu runs it
def test_the_contract_suite_passes_under_emulate_cuda():
    if emulation_active() is not None or torch.cuda.is_available():
        pytest.skip("runs the contract under --emulate-cuda from a session outside it, without a GPU")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
               "--repro-dir", "none", "--emulate-cuda", "-m", "not slow", "suites/graphs"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert " passed" in summary and not re.search(r"\d+ (failed|error)", summary), summary
