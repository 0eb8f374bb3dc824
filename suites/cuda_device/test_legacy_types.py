"""torch's legacy tensor types on the emulated device (legacy_types.py): `torch.cuda.FloatTensor(...)`
and its kin make device tensors, isinstance tells device tensors from host ones, and
`torch.set_default_tensor_type(torch.cuda.FloatTensor)` sends factories to the device, as CUDA
does (measured on the H100, torch 2.11)."""

from __future__ import annotations

import warnings
from typing import Iterator

import pytest
import torch

import harness
from harness.emulation.device_memory import is_device_memory

DTYPES = {"FloatTensor": torch.float32, "DoubleTensor": torch.float64, "HalfTensor": torch.float16,
          "BFloat16Tensor": torch.bfloat16, "ByteTensor": torch.uint8, "CharTensor": torch.int8,
          "ShortTensor": torch.int16, "IntTensor": torch.int32, "LongTensor": torch.int64,
          "BoolTensor": torch.bool}


@pytest.fixture
def two_devices(outside_emulation) -> Iterator[object]:
    with harness.emulate_cuda(device="cpu", device_count=2) as state:
        yield state


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_each_cuda_type_makes_device_memory_of_its_dtype(cuda_device, name):
    legacy = getattr(torch.cuda, name)
    before = torch.cuda.memory_allocated()
    t = legacy(2)
    made = torch.cuda.memory_allocated() - before
    assert (t.shape, t.dtype, str(t.device), t.is_cuda) == ((2,), DTYPES[name], "cuda:0", True)
    assert is_device_memory(t)
    reference = torch.empty(2, dtype=DTYPES[name], device="cuda")
    assert made == torch.cuda.memory_allocated() - before - made > 0
    assert isinstance(t, legacy) and isinstance(reference, legacy)
    assert not isinstance(t, getattr(torch, name))


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_the_constructor_forms(cuda_device, name):
    legacy = getattr(torch.cuda, name)
    assert legacy().shape == (0,)
    assert legacy(2, 3).shape == (2, 3)
    assert legacy(torch.Size([2, 3])).shape == (2, 3)
    data = legacy([1, 0, 1])
    assert data.tolist() == torch.tensor([1, 0, 1], dtype=DTYPES[name]).tolist()
    assert legacy((2, 3)).tolist() == torch.tensor([2, 3], dtype=DTYPES[name]).tolist()  # data
    for made in (legacy(), legacy(2, 3), legacy(torch.Size([1])), data):
        assert made.dtype == DTYPES[name] and made.is_cuda and is_device_memory(made)


def test_the_named_examples(cuda_device):
    long = torch.cuda.LongTensor([1, 2])
    assert long.tolist() == [1, 2] and long.dtype == torch.int64 and str(long.device) == "cuda:0"
    half = torch.cuda.HalfTensor(2, 3)
    assert (half.shape, half.dtype, str(half.device)) == ((2, 3), torch.float16, "cuda:0")


def test_the_device_keyword_and_the_current_device(two_devices):
    assert str(torch.cuda.FloatTensor(2, device=1).device) == "cuda:1"
    assert str(torch.cuda.FloatTensor([1.0], device="cuda:1").device) == "cuda:1"
    assert str(torch.cuda.IntTensor(device=torch.device("cuda", 1)).device) == "cuda:1"
    with torch.cuda.device(1):
        assert str(torch.cuda.FloatTensor(2).device) == "cuda:1"
    with pytest.raises(RuntimeError, match="legacy constructor expects device type: cuda but "
                                           "device type: cpu was passed"):
        torch.cuda.FloatTensor(2, device="cpu")


def test_torchs_own_errors_for_what_it_does_not_parse(cuda_device):
    with pytest.raises(TypeError, match=r"new\(\): data must be a sequence \(got float\)"):
        torch.cuda.FloatTensor(2.5)
    with pytest.raises(TypeError, match="received an invalid combination of arguments"):
        torch.cuda.FloatTensor(2, dtype=torch.float32)


def test_a_device_tensor_passed_in_comes_back_as_an_alias(cuda_device):
    t = torch.ones(2, device="cuda")
    alias = torch.cuda.FloatTensor(t)
    assert alias.data_ptr() == t.data_ptr() and alias.is_cuda
    with pytest.raises(TypeError, match=r"expected TensorOptions\(dtype=long int, device=cuda, "
                                        r"layout=Strided, .*\(got TensorOptions\(dtype=float, "
                                        r"device=cuda:0, layout=Strided"):
        torch.cuda.LongTensor(t)
    with pytest.raises(TypeError, match=r"\(got TensorOptions\(dtype=float, device=cpu, "):
        torch.cuda.FloatTensor(torch.ones(2))
    with pytest.raises(RuntimeError, match='to a storage on different device "cpu"'):
        torch.cuda.FloatTensor(torch.UntypedStorage(8))
    assert torch.cuda.FloatTensor(t.untyped_storage()).data_ptr() == t.data_ptr()


def test_isinstance_tells_device_from_host(cuda_device):
    device, host = torch.ones(2, device="cuda"), torch.ones(2)
    assert isinstance(device, torch.cuda.FloatTensor) and not isinstance(host, torch.cuda.FloatTensor)
    assert isinstance(host, torch.FloatTensor) and not isinstance(device, torch.FloatTensor)
    assert not isinstance(device, torch.cuda.DoubleTensor) and not isinstance(3, torch.cuda.FloatTensor)
    assert isinstance(device.half(), torch.cuda.HalfTensor)


def test_type_conversions_land_on_the_legacy_types(cuda_device):
    device, host = torch.ones(2, device="cuda"), torch.ones(2)
    assert isinstance(device.type(torch.cuda.HalfTensor), torch.cuda.HalfTensor)
    assert isinstance(host.type("torch.cuda.LongTensor"), torch.cuda.LongTensor)
    assert isinstance(device.type(torch.DoubleTensor), torch.DoubleTensor)
    assert host.type(torch.DoubleTensor).dtype == torch.float64  # torch's own type, by name
    assert device.type() == "torch.cuda.FloatTensor"
    assert repr(torch.cuda.FloatTensor) == "<class 'torch.cuda.FloatTensor'>"


def test_the_constructor_warns_once_as_cuda_does(outside_emulation):
    with harness.emulate_cuda(device="cpu"):
        with pytest.warns(UserWarning, match=r"The torch\.cuda\.\*DtypeTensor constructors are no "
                                             r"longer recommended"):
            torch.cuda.FloatTensor(2)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            torch.cuda.FloatTensor(2)


def test_set_default_tensor_type_sends_factories_to_the_device(cuda_device):
    try:
        with pytest.warns(UserWarning, match="set_default_tensor_type"):
            torch.set_default_tensor_type(torch.cuda.FloatTensor)
        assert str(torch.empty(1).device) == "cuda:0" and is_device_memory(torch.zeros(2))
        assert torch.tensor([1.0]).is_cuda and not torch.zeros(1, device="cpu").is_cuda
        torch.set_default_tensor_type("torch.cuda.DoubleTensor")
        assert torch.empty(1).dtype == torch.float64 and torch.empty(1).is_cuda
        with pytest.raises(TypeError, match="only floating-point types are supported"):
            torch.set_default_tensor_type(torch.cuda.LongTensor)
    finally:
        torch.set_default_tensor_type(torch.FloatTensor)
    assert not torch.empty(1).is_cuda and torch.get_default_dtype() == torch.float32
