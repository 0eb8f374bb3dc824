"""`torch.backends.cuda.cufft_plan_cache` on the emulated device.

CUDA keeps a cache of cuFFT plans per device (ATen's CuFFTPlanCache): `max_size` is 4096 by default
(CUDA 10 and later) and can be set to any non-negative number, which drops plans beyond it;
`size` counts the plans cached; `clear()` drops them all. The emulated device runs its FFTs with the
CPU's kernels, which make no cuFFT plans: `size` stays 0, and `max_size` and `clear()` keep CUDA's
settings and checks, so a runtime that limits the cache (a common setting for models whose FFT
lengths vary) runs as on CUDA instead of failing where a CPU build has no cuFFT."""

from __future__ import annotations

from typing import Any

CUFFT_DEFAULT_CACHE_SIZE = 4096
_SIZE_READ_ONLY = (".size is a read-only property showing the number of plans currently in the "
                   "cache. To change the cache capacity, set cufft_plan_cache.max_size.")


class PlanCaches:
    """Each device's cache setting: the capacity a runtime set, CUDA's default otherwise."""

    def __init__(self) -> None:
        self._max_sizes: dict[int, int] = {}

    def max_size(self, index: int) -> int:
        return self._max_sizes.get(index, CUFFT_DEFAULT_CACHE_SIZE)

    def set_max_size(self, index: int, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"cufft_plan_cache.max_size takes an int, got {type(value).__name__}")
        if value < 0:
            raise RuntimeError(f"cuFFT plan cache size must be non-negative, but got {value}")
        self._max_sizes[index] = value


def size_property(state) -> property:
    def size(cache) -> int:
        return 0  # the CPU's FFT kernels make no cuFFT plans

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
        """Nothing is cached: the CPU's FFT kernels make no plans."""

    return clear
