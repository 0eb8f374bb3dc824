"""`torch.backends.cuda.cufft_plan_cache` on the emulated device.

CUDA keeps a cache of cuFFT plans per device (ATen's CuFFTPlanCache): each FFT op looks its plan up
by what cuFFT plans for (the transform's kind, the signal's sizes and layout, the dtype) and makes
and caches one it lacks, so `size` counts the distinct plans made (an rfft of 64 floats: 0 before,
1 after, measured on an H200, torch 2.11); `max_size` is 4096 by default (CUDA 10 and later) and
can be set to any non-negative number, which drops the least recently used plans beyond it;
`clear()` drops them all. The emulated device runs its FFTs with the CPU's kernels; each `torch.fft`
call (and `stft`/`istft`) on the device notes the plan CUDA would make for it, keyed by the call's
kind (forward and inverse complex transforms share CUDA's plan), the input's shape, strides and
dtype and the call's sizes and dims. So a runtime that limits or watches the cache (a common
setting for models whose FFT lengths vary) runs as on CUDA instead of failing where a CPU build
has no cuFFT."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

CUFFT_DEFAULT_CACHE_SIZE = 4096
_SIZE_READ_ONLY = (".size is a read-only property showing the number of plans currently in the "
                   "cache. To change the cache capacity, set cufft_plan_cache.max_size.")


# torch's FFT calls by the cuFFT transform each plans: complex to complex (either direction), real
# to complex, complex to real
_C2C, _R2C, _C2R = "c2c", "r2c", "c2r"
FFT_KINDS = {
    **{getattr(torch.fft, name): _C2C for name in ("fft", "ifft", "fft2", "ifft2", "fftn", "ifftn")},
    **{getattr(torch.fft, name): _R2C for name in ("rfft", "rfft2", "rfftn", "ihfft", "ihfft2",
                                                   "ihfftn")},
    **{getattr(torch.fft, name): _C2R for name in ("irfft", "irfft2", "irfftn", "hfft", "hfft2",
                                                   "hfftn")},
    torch.stft: _R2C, torch.Tensor.stft: _R2C, torch.istft: _C2R, torch.Tensor.istft: _C2R,
}


def plan_key(func, args: tuple, kwargs: dict) -> tuple | None:
    """What cuFFT plans a call for: its transform, its input's layout and dtype, and its sizes and
    dims (the normalization and the output are not part of a plan); None without a tensor input."""
    signal = args[0] if args else kwargs.get("input")
    if not isinstance(signal, torch.Tensor):
        return None
    sizes = tuple(repr(a) for a in args[1:] if not isinstance(a, torch.Tensor))
    options = tuple(sorted((k, repr(v)) for k, v in kwargs.items()
                           if k not in ("input", "norm", "out") and not isinstance(v, torch.Tensor)))
    return (FFT_KINDS[func], tuple(signal.shape), signal.stride(), signal.dtype, sizes, options)


class PlanCaches:
    """Each device's cache: the plans its FFTs made, least recently used first, and the capacity a
    runtime set (CUDA's default otherwise)."""

    def __init__(self) -> None:
        self._max_sizes: dict[int, int] = {}
        self._plans: dict[int, OrderedDict] = {}

    def size(self, index: int) -> int:
        return len(self._plans.get(index, ()))

    def note_plan(self, index: int, key: tuple) -> None:
        """An FFT on device `index` used the plan `key`: cached, or made and cached (the least
        recently used ones dropped beyond the capacity)."""
        plans = self._plans.setdefault(index, OrderedDict())
        plans[key] = None
        plans.move_to_end(key)
        self._trim(index)

    def clear(self, index: int) -> None:
        self._plans.pop(index, None)

    def _trim(self, index: int) -> None:
        plans = self._plans.get(index)
        while plans and len(plans) > self.max_size(index):
            plans.popitem(last=False)

    def max_size(self, index: int) -> int:
        return self._max_sizes.get(index, CUFFT_DEFAULT_CACHE_SIZE)

    def set_max_size(self, index: int, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"cufft_plan_cache.max_size takes an int, got {type(value).__name__}")
        if value < 0:
            raise RuntimeError(f"cuFFT plan cache size must be non-negative, but got {value}")
        self._max_sizes[index] = value
        self._trim(index)


def size_property(state) -> property:
    def size(cache) -> int:
        return state.fft_plans.size(cache.device_index)

    def refuse(cache, value) -> None:
        raise RuntimeError(_SIZE_READ_ONLY)

    return property(size, refuse)


def max_size_property(state) -> property:
    def get(cache) -> int:
        return state.fft_plans.max_size(cache.device_index)

    def set_(cache, value) -> None:
        state.fft_plans.set_max_size(cache.device_index, value)

    return property(get, set_)


def clear_method(state):
    def clear(cache) -> None:
        state.fft_plans.clear(cache.device_index)

    return clear
