"""One predicate says whether a tensor (or a storage) is the emulated device's memory
(`harness.emulation.device_memory.is_device_memory`): what placement, autograd's products,
checkpoints and the memory registry all ask."""

from __future__ import annotations

import torch

from harness.emulation.device_memory import is_device_memory


def test_device_tensors_their_views_and_storages_are_device_memory(cuda_device):
    x = torch.ones(4, 4, device="cuda")
    for t in (x, x[1:], x.t(), x.data, x.view(-1)):
        assert is_device_memory(t)
    assert is_device_memory(x.untyped_storage())
    assert is_device_memory(torch.ones(2).cuda()) and is_device_memory(torch.nn.Linear(2, 2).cuda().weight)


def test_host_pinned_and_storage_less_tensors_are_not(cuda_device):
    assert not is_device_memory(torch.ones(2))
    assert not is_device_memory(torch.ones(2).pin_memory())
    assert not is_device_memory(torch.ones(2).untyped_storage())
    assert not is_device_memory(torch.ones(2, device="cuda").cpu())
    assert not is_device_memory(torch.sparse_coo_tensor([[0]], [1.0], (2,)))


def test_the_registry_and_the_predicate_agree(cuda_device):
    x, host = torch.zeros(3, device="cuda"), torch.zeros(3)
    assert cuda_device.memory.is_device(x) and not cuda_device.memory.is_device(host)
    cuda_device.memory.mark_device(host)
    assert is_device_memory(host) and host.is_cuda
