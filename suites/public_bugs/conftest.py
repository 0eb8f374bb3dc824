"""Miniatures of public capture bugs, written against `torch.cuda` as a runtime team writes them.
Each test runs inside the harness's device: the emulated CUDA device on a CPU (the session's under
`--emulate-cuda`, else one per test), the graph sanitizer (`harness.emulate_cuda()` over the real
device) on a GPU. The buggy version must fail with the harness's named error, the fixed one pass.

Under `--emulate-cuda`, tests marked `explains_against_eager` or `strict_races` are skipped with
the reason in a session whose device settings they cannot check (fixtures/session_device_limits.py).
A file that sets `RUNS_NATIVELY_ON_A_GPU = True` runs on CUDA itself where there is one."""

from __future__ import annotations

import pytest
import torch

import harness
from harness.emulation import emulation_active


@pytest.fixture(autouse=True)
def harness_device(request):
    if emulation_active() is not None:
        yield
        return
    if "no_device_context" in request.keywords:
        yield
        return
    # A file setting RUNS_NATIVELY_ON_A_GPU = True runs on CUDA where there is one: what it checks
    # is CUDA's own answer, not the sanitizer's.
    if getattr(request.module, "RUNS_NATIVELY_ON_A_GPU", False) and torch.cuda.is_available():
        yield
        return
    with harness.emulate_cuda():
        yield
