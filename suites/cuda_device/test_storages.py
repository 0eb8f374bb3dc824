"""A device tensor's storage says what a CUDA storage says: its device, `is_cuda`, shared (every
CUDA storage is, to torch), and `torch.UntypedStorage(..., device="cuda")` makes device memory;
sharing it with another process is refused by name."""

from __future__ import annotations

import pytest
import torch

import harness


def test_a_device_tensors_storage_is_on_the_device(cuda_device):
    t = torch.ones(3, device="cuda")
    storage = t.untyped_storage()
    assert storage.device == torch.device("cuda", 0) and storage.is_cuda
    assert t.is_shared() and storage.is_shared()
    host = torch.ones(3)
    assert host.untyped_storage().device.type == "cpu" and not host.is_shared()
    assert not host.untyped_storage().is_cuda


def test_share_memory_leaves_a_device_tensor_where_it_is(cuda_device):
    t = torch.ones(3, device="cuda")
    assert t.share_memory_() is t and t.is_cuda and t.is_shared()


def test_storages_made_on_the_device(cuda_device):
    made = torch.UntypedStorage(8, device="cuda")
    assert type(made) is torch.UntypedStorage and made.device.type == "cuda"
    assert made.nbytes() == 8
    assert torch.UntypedStorage([1, 2, 3], device="cuda").tolist() == [1, 2, 3]
    typed = torch.TypedStorage(4, dtype=torch.float32, device="cuda")
    assert typed.is_cuda and typed.size() == 4
    assert torch.UntypedStorage(4).device.type == "cpu"
    before = torch.cuda.memory_allocated()
    held = torch.UntypedStorage(1 << 20, device="cuda")
    assert torch.cuda.memory_allocated() - before >= 1 << 20
    del held


def test_a_device_storage_copies_to_the_host(cuda_device):
    t = torch.arange(4, dtype=torch.uint8, device="cuda")
    host = t.untyped_storage().cpu()
    assert host.device.type == "cpu" and host.tolist() == [0, 1, 2, 3]


def test_the_storage_on_a_second_device():
    if torch.cuda.is_available() or harness.emulation.emulation_active() is not None:
        pytest.skip("enters emulate_cuda(device='cpu', device_count=2) itself, without a GPU")
    with harness.emulate_cuda(device="cpu", device_count=2):
        assert torch.ones(2, device="cuda:1").untyped_storage().device == torch.device("cuda", 1)
    assert "device" not in vars(torch.UntypedStorage)  # torch's own again after leaving


def test_sharing_with_another_process_is_refused_by_name(cuda_device):
    from torch.multiprocessing.reductions import reduce_tensor

    with pytest.raises(NotImplementedError, match="CUDA IPC.*emulated CUDA device: it lives in one process"):
        reduce_tensor(torch.ones(2, device="cuda"))


def test_a_deep_copy_of_a_device_tensor_is_new_device_memory(cuda_device):
    """copy.deepcopy reaches `torch.UntypedStorage(n, device="cuda")` from inside the placement
    mode's handling of the call; it failed there ("Could not run 'aten::empty.memory_format' with
    arguments from the 'CUDA' backend") before 2026-12-06."""
    import copy

    x = torch.arange(4.0, device="cuda")
    view = x[1:3]
    x_copy, view_copy = copy.deepcopy((x, view))
    assert x_copy.is_cuda and x_copy.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert x_copy.data_ptr() != x.data_ptr()
    view_copy.fill_(9.0)  # the copies share their new storage, as the originals did
    assert x_copy.tolist() == [0.0, 9.0, 9.0, 3.0] and x.tolist() == [0.0, 1.0, 2.0, 3.0]
    weight = torch.nn.Parameter(torch.ones(2, device="cuda"))
    weight_copy = copy.deepcopy(weight)
    assert isinstance(weight_copy, torch.nn.Parameter) and weight_copy.is_cuda


def test_a_deep_copy_stays_on_its_device(outside_emulation):
    import copy

    with harness.emulate_cuda(device="cpu", device_count=2):
        assert copy.deepcopy(torch.ones(2, device="cuda:1")).device == torch.device("cuda", 1)


def test_an_event_from_another_process_is_refused_by_name(cuda_device):
    # torch.cuda.Event.from_ipc_handle exists on CUDA; the emulated Event lacked it (AttributeError)
    shared = torch.cuda.Event(interprocess=True)
    shared.record()
    with pytest.raises(NotImplementedError, match="emulated CUDA device"):
        shared.ipc_handle()
    with pytest.raises(NotImplementedError, match="from_ipc_handle.*emulated CUDA device"):
        torch.cuda.Event.from_ipc_handle(0, bytes(64))
