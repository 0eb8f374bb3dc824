"""CUDA's autocast promote policy (autocast_mode.h's `prioritize`): an op of the promote list runs
in float32 once a float32 device input is met, in the autocast dtype while every input is in it,
and refuses a float16 input under bfloat16 autocast (or bfloat16 under float16) met before any
float32. The expected answers are the op database's rows on an H100 (torch 2.11)."""

from __future__ import annotations

import pytest
import torch

PROMOTED = {
    "dot": lambda a, b: torch.dot(a, b),
    "atan2": lambda a, b: torch.atan2(a, b),
    "addcmul": lambda a, b: torch.addcmul(a, a, b),
    "cross": lambda a, b: torch.cross(a.view(2, 3), b.view(2, 3), dim=1),
}
_OTHER = {torch.float16: torch.bfloat16, torch.bfloat16: torch.float16}


@pytest.mark.parametrize("autocast_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(PROMOTED))
def test_the_other_reduced_dtype_is_refused(cuda_kind, name, autocast_dtype):
    x = torch.randn(6, device="cuda", dtype=_OTHER[autocast_dtype])
    with torch.autocast("cuda", dtype=autocast_dtype), pytest.raises(
            RuntimeError, match="Unexpected floating ScalarType in at::autocast::prioritize"):
        PROMOTED[name](x, x)


@pytest.mark.parametrize("name", sorted(PROMOTED))
def test_float32_first_promotes_the_rest_and_one_dtype_runs_in_it(cuda_kind, name):
    x32 = torch.randn(6, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        assert PROMOTED[name](x32, x32.bfloat16()).dtype == torch.float32
        assert PROMOTED[name](x32.half(), x32.half()).dtype == torch.float16
        # float64 is ignored and never cast
        assert PROMOTED[name](x32.double(), x32.double()).dtype == torch.float64
        with pytest.raises(RuntimeError, match="Unexpected floating ScalarType"):
            PROMOTED[name](x32.bfloat16(), x32)  # met before the float32


def test_cat_and_stack_are_off_the_list_and_promote_as_without_autocast(cuda_kind):
    x = torch.randn(2, device="cuda", dtype=torch.bfloat16)
    with torch.autocast("cuda", dtype=torch.float16):
        assert torch.cat([x, x]).dtype == torch.stack([x, x]).dtype == torch.bfloat16
        assert torch.cat([x, x.float()]).dtype == torch.float32
