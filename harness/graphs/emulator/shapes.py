"""An op's results as meta tensors, without running it: how the recorder allocates a captured op's
outputs, and how the adversarial schedule allocates a deferred op's."""

from __future__ import annotations

from typing import Any

import torch

from harness import torch_internals
from harness.torch_internals import tree_map_only
from harness.graphs.base import CaptureError
from harness.graphs.emulator import opinfo
from harness.graphs.emulator.callsite import at_callsite, current_callsite


def to_meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="meta")


def lacks_meta_kernel(error: Exception) -> bool:
    """Whether running an op on meta tensors failed for want of a meta kernel, rather than for a
    shape error of the caller's, which must surface at capture as CUDA's host checks would."""
    text = str(error).lower()
    return isinstance(error, NotImplementedError) or "meta" in text or "fake" in text


def result_shapes(func, args, kwargs) -> Any:
    """`func`'s results on meta tensors (its meta kernel, else its fake implementation)."""
    if not func._schema.returns:
        return None
    meta_args, meta_kwargs = tree_map_only(torch.Tensor, to_meta, (args, kwargs))
    if meta_kwargs.get("generator") is not None:
        meta_kwargs = {**meta_kwargs, "generator": None}  # the refs refuse one; shapes ignore it
    if "device" in {a.name for a in func._schema.arguments}:
        meta_kwargs = {**meta_kwargs, "device": "meta"}
    try:
        return func(*meta_args, **meta_kwargs)
    except (NotImplementedError, RuntimeError, AttributeError) as meta_error:
        # An AttributeError: a meta kernel that reads fake tensors' attributes (torch's
        # `_weight_int4pack_mm` asks `w.fake_device`), which the fake implementation answers.
        if not lacks_meta_kernel(meta_error):
            raise
    return _fake_shapes(func, args, kwargs)


def _fake_shapes(func, args, kwargs) -> Any:

    mode = torch_internals.fake_tensor_mode(allow_non_fake_inputs=True)
    try:
        fake_args, fake_kwargs = tree_map_only(torch.Tensor, mode.from_tensor, (args, kwargs))
        with mode:
            return func(*fake_args, **fake_kwargs)
    except Exception as fake_error:
        hint = (" register one with torch.library.register_fake"
                if func.namespace not in ("aten", "prims") else "")
        raise CaptureError(at_callsite(
            f"{opinfo.op_name(func)} returns fresh tensors, and the emulator needs their shapes "
            f"without running it, but it has no meta or fake implementation;{hint} "
            f"({type(fake_error).__name__}: {fake_error})", current_callsite()),
            op=opinfo.op_name(func)) from fake_error
