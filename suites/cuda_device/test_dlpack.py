"""DLPack on the emulated device: a device tensor reports a CUDA DLPack device, and what
`torch.from_dlpack` makes of it (the tensor, or `to_dlpack`'s capsule) is a device alias of the
same memory, as on CUDA."""

from __future__ import annotations

import pytest
import torch
from torch.utils import dlpack

import harness


def test_a_device_tensor_is_a_cuda_dlpack_device(cuda_device):
    t = torch.ones(2, device="cuda")
    assert t.__dlpack_device__() == (dlpack.DLDeviceType.kDLCUDA, 0)
    assert torch.ones(2).__dlpack_device__() == (dlpack.DLDeviceType.kDLCPU, 0)


def test_from_dlpack_of_a_device_view_aliases_it_on_the_device(cuda_device):
    t = torch.arange(6.0, device="cuda").view(2, 3)[:, 1:]
    alias = torch.from_dlpack(t)
    assert alias.is_cuda and alias.shape == t.shape and alias.stride() == t.stride()
    assert alias.data_ptr() == t.data_ptr()
    alias[0, 0] = 100.0
    assert t[0, 0].item() == 100.0
    assert (alias + t).is_cuda  # no mixed-device refusal: both are device memory


def test_a_capsule_comes_back_on_the_device(cuda_device):
    t = torch.arange(4.0, device="cuda")
    back = dlpack.from_dlpack(dlpack.to_dlpack(t))
    assert back.is_cuda and back.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert back.data_ptr() == t.data_ptr()


def test_a_copy_is_device_memory_of_its_own(cuda_device):
    t = torch.arange(4.0, device="cuda")
    copied = torch.from_dlpack(t, copy=True)
    assert copied.is_cuda and copied.data_ptr() != t.data_ptr()


def test_host_tensors_stay_on_the_host(cuda_device):
    assert not torch.from_dlpack(torch.ones(2)).is_cuda


def test_the_second_device_keeps_its_index():
    if torch.cuda.is_available() or harness.emulation.emulation_active() is not None:
        pytest.skip("enters emulate_cuda(device='cpu', device_count=2) itself, without a GPU")
    with harness.emulate_cuda(device="cpu", device_count=2):
        t = torch.ones(2, device="cuda:1")
        assert t.__dlpack_device__() == (dlpack.DLDeviceType.kDLCUDA, 1)
        assert torch.from_dlpack(t).device == torch.device("cuda", 1)
