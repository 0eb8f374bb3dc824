"""Whether the installed triton can emit and launch PDL kernels (triton_pdl.py), and the launch
keywords of a kernel launched with PDL or not. Imports triton only when asked, so installs
without it can ask too."""

from __future__ import annotations

import dataclasses
import functools


@functools.cache
def pdl_missing() -> str | None:
    """What this install lacks for PDL launches (None: nothing): triton itself, the intrinsics in
    `triton.language.extra.cuda`, or the `launch_pdl` option of its CUDA backend."""
    try:
        import triton
    except Exception as error:  # a broken install raises more than ImportError
        return f"triton is not importable ({type(error).__name__}: {error})"
    version = getattr(triton, "__version__", "?")
    try:
        from triton.language.extra import cuda
    except ImportError as error:
        return f"triton {version} has no triton.language.extra.cuda ({error})"
    absent = [name for name in ("gdc_wait", "gdc_launch_dependents") if not hasattr(cuda, name)]
    if absent:
        return f"triton {version} has no triton.language.extra.cuda.{' / '.join(absent)}"
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError as error:
        return f"triton {version} has no CUDA backend options ({error})"
    if "launch_pdl" not in {f.name for f in dataclasses.fields(CUDAOptions)}:
        return f"triton {version}'s CUDA backend has no launch_pdl option"
    return None


def pdl_launch_options(pdl: bool) -> dict[str, bool]:
    """The launch keywords of a kernel launched with PDL or not: with it, the kernel's USE_PDL
    constexpr and triton's `launch_pdl`; without, nothing (the kernel's default, as before PDL).
    Asking for PDL where this triton cannot launch it is refused, naming what is missing."""
    if not pdl:
        return {}
    missing = pdl_missing()
    if missing is not None:
        raise ValueError(f"a PDL launch was asked for, but {missing}; launch with pdl=False")
    return {"USE_PDL": True, "launch_pdl": True}
