"""The emulated CUDA device's checks run inside `harness.emulate_cuda(device="cpu")`, or inside the
session's emulation under `--emulate-cuda`. On a machine with a GPU they are skipped: there the
context is the graph sanitizer (its own gpu-marked tests)."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch

import harness
from harness.emulation import emulation_active
from harness.emulation.session import active_state


@pytest.fixture
def cuda_device():
    """The emulated device's state (what emulate_cuda() yields)."""
    if emulation_active() == "cpu":
        yield active_state()
    elif emulation_active() is not None or torch.cuda.is_available():
        pytest.skip("a real GPU: the emulated CUDA device is checked without one")
    else:
        with harness.emulate_cuda(device="cpu") as state:
            yield state


@pytest.fixture
def outside_emulation():
    """For checks of entering and leaving: no emulation may be active around them."""
    if emulation_active() is not None:
        pytest.skip("runs outside emulate_cuda(); the session is inside it (--emulate-cuda)")
    if torch.cuda.is_available():
        pytest.skip("a real GPU: device='cpu' cannot be entered after CUDA was initialized")


@pytest.fixture(params=["emulated", pytest.param("native", marks=pytest.mark.gpu),
                        pytest.param("sanitizer", marks=pytest.mark.gpu)])
def cuda_kind(request) -> Iterator[str]:
    """Where a check that must hold on CUDA runs: the emulated device, natively on a GPU (to show
    CUDA's own verdict), or in the graph sanitizer."""
    where = request.param
    if where == "emulated":
        if emulation_active() == "cpu":
            yield where
            return
        if emulation_active() is not None or torch.cuda.is_available():
            pytest.skip("a real GPU: the emulated CUDA device is checked without one")
        with harness.emulate_cuda(device="cpu"):
            yield where
        return
    if emulation_active() is not None:
        pytest.skip("checks real CUDA outside any emulation")
    if where == "native":
        yield where
        return
    with harness.emulate_cuda():
        yield where


@pytest.fixture(params=["emulated", pytest.param("native", marks=pytest.mark.gpu)])
def two_devices(request) -> Iterator[str]:
    """Two CUDA devices: emulated ones, or a machine's own two GPUs."""
    if request.param == "native":
        if emulation_active() is not None:
            pytest.skip("checks real CUDA outside any emulation")
        if torch.cuda.device_count() < 2:
            pytest.skip("needs two GPUs")
        yield request.param
        return
    if emulation_active() is not None or torch.cuda.is_available():
        pytest.skip("two emulated devices are entered outside any emulation, without a GPU")
    with harness.emulate_cuda(device="cpu", device_count=2):
        yield request.param
