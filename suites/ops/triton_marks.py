"""Skip marks of the Triton kernel tests: triton importable, its interpreter on or off."""

from __future__ import annotations

import os

import pytest

from harness.ops.decode_kernel import triton_import_error

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

needs_triton = pytest.mark.skipif(triton_import_error() is not None,
                                  reason=f"triton is not importable: {triton_import_error()}")
needs_interpreter = pytest.mark.skipif(not INTERPRETED, reason="runs Triton's interpreter on CPU "
                                       "tensors: set TRITON_INTERPRET=1")
needs_compiled_triton = pytest.mark.skipif(INTERPRETED, reason="TRITON_INTERPRET=1 runs kernels "
                                           "on CPU tensors, these use CUDA ones")
