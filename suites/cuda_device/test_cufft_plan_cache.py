"""`torch.backends.cuda.cufft_plan_cache` answers as CUDA's per-device cuFFT plan cache: a capacity of
4096 plans by default, settable to any non-negative number, a read-only `size`, `clear()`. A
runtime that limits the cache (models whose FFT lengths vary) failed on the emulated device: "Cannot
access cuFFT plan cache without ATen_cuda library" on a CPU build, a device-index error on a CUDA
wheel without a GPU. The emulated device's FFTs make no plans, so its `size` stays 0 (on CUDA it
counts the plans made), which these rows do not compare."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def plan_cache(cuda_kind):
    cache = torch.backends.cuda.cufft_plan_cache
    yield cache
    cache.max_size = 4096  # CUDA's default, for the process's later tests


def test_the_cache_capacity_is_cudas_default_and_settable(plan_cache):
    assert plan_cache.max_size == 4096
    plan_cache.max_size = 0
    assert plan_cache[0].max_size == 0 == plan_cache.max_size
    spectrum = torch.fft.rfft(torch.ones(64, device="cuda"))  # still runs with no plans kept
    assert spectrum.is_cuda and spectrum[0].real.item() == 64.0
    plan_cache.clear()
    assert plan_cache.size == 0


def test_a_negative_capacity_and_a_size_set_are_refused(plan_cache):
    with pytest.raises(RuntimeError, match="^cuFFT plan cache size must be non-negative, but got -1"):
        plan_cache.max_size = -1
    with pytest.raises(RuntimeError, match="^.size is a read-only property"):
        plan_cache.size = 3
    with pytest.raises(RuntimeError, match="expected 0 <= device index < "):
        plan_cache[torch.cuda.device_count()]
