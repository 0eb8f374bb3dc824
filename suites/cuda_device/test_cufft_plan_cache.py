"""`torch.backends.cuda.cufft_plan_cache` answers as CUDA's per-device cuFFT plan cache: a capacity of
4096 plans by default, settable to any non-negative number, a read-only `size`, `clear()`. A
runtime that limits the cache (models whose FFT lengths vary) failed on the emulated device: "Cannot
access cuFFT plan cache without ATen_cuda library" on a CPU build, a device-index error on a CUDA
wheel without a GPU; and its `size` stayed 0 after FFTs, where CUDA counts the plans they made."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def plan_cache(cuda_kind):
    cache = torch.backends.cuda.cufft_plan_cache
    cache.clear()  # the process's earlier FFTs' plans
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


def test_each_distinct_plan_is_cached_once_within_the_capacity(plan_cache):
    signal = torch.randn(64, device="cuda")
    assert plan_cache.size == 0
    torch.fft.rfft(signal)  # measured on an H200, torch 2.11: (0, 4096) before, (1, 4096) after
    assert (plan_cache.size, plan_cache.max_size) == (1, 4096)
    torch.fft.rfft(signal * 2)  # the same plan again
    assert plan_cache.size == 1
    torch.fft.rfft(torch.randn(32, device="cuda"))
    torch.fft.irfft(torch.fft.rfft(signal))
    assert plan_cache.size == 3  # another length, and a complex-to-real transform
    plan_cache.max_size = 2  # drops the least recently used beyond it
    assert plan_cache.size == 2
    torch.fft.fft(torch.randn(16, device="cuda", dtype=torch.complex64))
    assert plan_cache.size == 2
    plan_cache.clear()
    assert plan_cache.size == 0
