"""The compiled path (`EngineConfig.compile="inductor"`): the static pieces between the attention
ops compiled by inductor (piece.py, backend.py), the whole step as one compiled function that the
decode graphs capture (step.py), and the opaque op through which a dispatcher-level recording sees
a compiled piece (piece_op.py)."""

from harness.runtime.compiled.piece import CompileInCaptureError, NestedCudagraphsError

__all__ = ["CompileInCaptureError", "NestedCudagraphsError"]
