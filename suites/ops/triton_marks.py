"""Skip marks of the Triton kernel tests: triton importable, its interpreter on, able to run the
kernels, or off."""

from __future__ import annotations

import functools
import os

import pytest
import torch

from harness.ops.decode_kernel import triton_import_error

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def interpreter_blocker() -> str | None:
    """Why Triton's interpreter cannot run the project's kernels here (None: it can, or it is off).
    Every kernel loops over a bound passed at launch; triton 3.6's interpreter turns such a bound
    into a one-element array and numpy 2.4 refuses to make a Python int of one, so each kernel
    fails the same way whatever it computes: a probe kernel of one such loop says so once."""
    if not INTERPRETED or triton_import_error() is not None:
        return None
    import numpy
    import triton
    import triton.language as tl

    @triton.jit
    def loop_over_a_runtime_bound(out_ptr, n):
        total = 0
        for _ in range(0, n):
            total += 1
        tl.store(out_ptr, total)

    out = torch.zeros(1, dtype=torch.int32)
    try:
        loop_over_a_runtime_bound[(1,)](out, 3)
    except Exception as error:  # the interpreter wraps what numpy raised in its own error
        return (f"triton {triton.__version__}'s interpreter cannot loop over a runtime bound with "
                f"numpy {numpy.__version__} ({type(error).__name__}: {error}); use numpy < 2.4 "
                f"or a triton whose interpreter can")
    if out.item() != 3:
        return (f"triton {triton.__version__}'s interpreter counted {out.item()} iterations of a "
                f"3-step loop")
    return None


needs_triton = pytest.mark.skipif(triton_import_error() is not None,
                                  reason=f"triton is not importable: {triton_import_error()}")
needs_interpreter = pytest.mark.skipif(
    not INTERPRETED or interpreter_blocker() is not None,
    reason=interpreter_blocker() or "runs Triton's interpreter on CPU tensors: set TRITON_INTERPRET=1")
def _on_the_emulated_device() -> bool:
    from harness.emulation import emulation_active

    return emulation_active() == "cpu"


# The emulated device runs a CUDA launch through Triton's interpreter, a Python call per program
# and block op: a 1B-shaped GEMV (3072 x 2048 weights, eight rows) takes minutes a case there. The
# interpreted tests on small shapes check the same kernels.
needs_a_real_gpu_for_model_shapes = pytest.mark.skipif(
    _on_the_emulated_device(), reason="the emulated device interprets Triton launches, minutes a "
    "case at the 1B model's shapes; the interpreted small-shape tests cover these kernels")


def on_a_real_gpu_only(why: str):
    """Skips a GPU row on the emulated device, `why` saying what only a real GPU answers."""
    return pytest.mark.skipif(_on_the_emulated_device(), reason=why)


ENGINE_PICKS_TRITON_ON_A_GPU = ("the engine runs Triton kernels on a real CUDA device only; on "
                                "the emulated device it refuses them by name (CPU tensors run the "
                                "torch-ops implementation)")
needs_compiled_triton = pytest.mark.skipif(INTERPRETED, reason="TRITON_INTERPRET=1 runs kernels "
                                           "on CPU tensors, these use CUDA ones")
