"""torch.fft's transforms of float16 (and complex32) device tensors, which CUDA computes and the CPU
refuses ("Unsupported dtype Half").

cuFFT runs half-precision transforms whose signal sizes are all powers of two
(CuFFTPlanCache.h's CuFFTConfig checks each: "cuFFT only supports dimensions whose sizes are powers
of two when computing in half precision, but got a signal size of[...]", the full two-sided sizes of
the transformed dims); a real input comes back complex32 from a forward or complex-to-complex
transform, a complex-to-real one (irfft, hfft) gives float16. The emulated device checks the sizes
as CUDA does, runs the CPU's transform on float32/complex64 copies and gives the result back in
CUDA's dtype. bfloat16 stays refused, as on CUDA. An `out=` call keeps the CPU's answer."""

from __future__ import annotations

from typing import Callable

import torch

from harness.emulation.fft_plans import FFT_KINDS

_HALF = (torch.float16, torch.complex32)
_WIDER = {torch.float16: torch.float32, torch.complex32: torch.complex64}
_NARROWER = {torch.float32: torch.float16, torch.complex64: torch.complex32}
_ONE_DIM = frozenset(getattr(torch.fft, n) for n in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft"))
_TWO_DIM = frozenset(getattr(torch.fft, n) for n in ("fft2", "ifft2", "rfft2", "irfft2", "hfft2",
                                                     "ihfft2"))
_N_DIM = frozenset(getattr(torch.fft, n) for n in ("fftn", "ifftn", "rfftn", "irfftn", "hfftn",
                                                   "ihfftn"))
CALLS = _ONE_DIM | _TWO_DIM | _N_DIM


def needs_widening(func, args: tuple, kwargs: dict) -> bool:
    signal = args[0] if args else kwargs.get("input")
    return isinstance(signal, torch.Tensor) and signal.dtype in _HALF and "out" not in kwargs


def _argument(args: tuple, kwargs: dict, at: int, name: str, default=None):
    return args[at] if len(args) > at else kwargs.get(name, default)


def signal_sizes(func, args: tuple, kwargs: dict) -> list[int]:
    """The transform's full signal sizes along its dims, as cuFFT plans it."""
    signal = args[0] if args else kwargs["input"]
    if func in _ONE_DIM:
        n = _argument(args, kwargs, 1, "n")
        dims = [_argument(args, kwargs, 2, "dim", -1)]
        given = None if n is None else [n]
    else:
        given = _argument(args, kwargs, 1, "s")
        dims = _argument(args, kwargs, 2, "dim", (-2, -1) if func in _TWO_DIM else None)
        if dims is None:
            dims = (range(-len(given), 0) if given is not None else range(signal.dim()))
        dims = [dims] if isinstance(dims, int) else list(dims)
    c2r = FFT_KINDS[func] == "c2r"
    sizes = []
    for i, dim in enumerate(dims):
        size = given[i] if given is not None and given[i] != -1 else None
        if size is None:
            size = signal.size(dim)
            if c2r and i == len(dims) - 1:
                size = 2 * (size - 1)
        sizes.append(size)
    return sizes


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def widened(func: Callable) -> Callable:
    """`func` run on float32/complex64 copies of its half input, its result in CUDA's dtype, after
    cuFFT's check of the signal sizes."""

    def run(*args, **kwargs):
        sizes = signal_sizes(func, args, kwargs)
        if not all(_power_of_two(n) for n in sizes):
            raise RuntimeError(
                "cuFFT only supports dimensions whose sizes are powers of two when computing in "
                f"half precision, but got a signal size of{sizes}")
        args = tuple(a.to(_WIDER[a.dtype]) if isinstance(a, torch.Tensor) and a.dtype in _HALF
                     else a for a in args)
        kwargs = {k: v.to(_WIDER[v.dtype]) if isinstance(v, torch.Tensor) and v.dtype in _HALF
                  else v for k, v in kwargs.items()}
        out = func(*args, **kwargs)
        return out.to(_NARROWER[out.dtype]) if out.dtype in _NARROWER else out

    run.__name__ = func.__name__
    return run


__all__ = ["CALLS", "needs_widening", "signal_sizes", "widened"]
