"""Factories on the emulated device take what torch takes: Python's scalar types as dtypes
(`torch.zeros(n, dtype=bool)`, as transformers builds masks), sized against the device's capacity
like any other dtype."""

from __future__ import annotations

import pytest
import torch

PYTHON_TYPES = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}


@pytest.mark.parametrize("python_type", list(PYTHON_TYPES), ids=lambda t: t.__name__)
def test_a_python_scalar_type_as_dtype_makes_a_device_tensor(cuda_device, python_type):
    for made in (torch.zeros(3, dtype=python_type, device="cuda"),
                 torch.ones((2, 2), dtype=python_type, device="cuda"),
                 torch.empty(4, dtype=python_type, device="cuda"),
                 torch.full((2,), 1, dtype=python_type, device="cuda")):
        assert made.is_cuda and made.dtype == PYTHON_TYPES[python_type]


def test_a_python_scalar_type_counts_against_the_capacity(cuda_device):
    too_many = cuda_device.properties.total_memory + 1  # bool: one byte each
    with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory"):
        torch.zeros(too_many, dtype=bool, device="cuda")
