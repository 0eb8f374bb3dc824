"""`torch.cuda.comm` across the emulated devices (device_comm.py): broadcast, scatter, gather and
reduce_add place their results as CUDA's torch/csrc/cuda/comm.cpp does, reduce_add takes NCCL's
path without a warning, nn.DataParallel runs forward and backward over two devices, and NCCL's
other collectives are refused by name."""

from __future__ import annotations

import warnings
from typing import Iterator

import pytest
import torch
import torch.cuda.comm as comm

import harness
from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice
from harness.emulation.device_memory import is_device_memory


@pytest.fixture
def two_devices(outside_emulation) -> Iterator[object]:
    with harness.emulate_cuda(device="cpu", device_count=2) as state:
        yield state


def _where(tensors) -> list[str]:
    return [str(t.device) for t in tensors]


def test_broadcast_on_one_device_returns_the_tensor_itself(cuda_device):
    x = torch.arange(4.0, device="cuda")
    out = comm.broadcast(x, devices=[0])
    assert len(out) == 1 and out[0] is x


def test_broadcast_copies_to_the_other_devices(two_devices):
    x = torch.arange(4.0, device="cuda:0")
    out = comm.broadcast(x, devices=[0, 1])
    assert _where(out) == ["cuda:0", "cuda:1"] and out[0] is x
    assert out[1].tolist() == x.tolist() and is_device_memory(out[1])
    host = comm.broadcast(torch.ones(2), devices=[1, 0])
    assert _where(host) == ["cuda:1", "cuda:0"] and all(map(is_device_memory, host))
    into = [torch.empty(4, device="cuda:1")]
    assert comm.broadcast(x, out=into)[0] is into[0] and into[0].tolist() == x.tolist()
    with pytest.raises(RuntimeError, match="Expected non-negative device index, but got -1"):
        comm.broadcast(x, devices=[0, -1])
    with pytest.raises(RuntimeError, match="Expected all output tensors to be CUDA tensors"):
        comm.broadcast(x, out=[torch.empty(4)])


def test_broadcast_coalesced_shares_one_buffer_per_dtype_on_each_other_device(two_devices):
    a, b = torch.arange(4.0, device="cuda"), torch.ones(2, 2, dtype=torch.long, device="cuda")
    c = torch.full((3,), 5.0, device="cuda", requires_grad=True)
    first, second = comm.broadcast_coalesced([a, b, c], [0, 1])
    assert first[0] is a and first[1] is b and first[2] is c
    assert _where(second) == ["cuda:1"] * 3
    assert [t.tolist() for t in second] == [a.tolist(), b.tolist(), c.tolist()]
    assert second[0].untyped_storage().data_ptr() == second[2].untyped_storage().data_ptr()
    assert not second[2].requires_grad
    with pytest.raises(RuntimeError, match=r"All tensors must be on devices\[0\]: 0"):
        comm.broadcast_coalesced([torch.ones(1, device="cuda:1")], [0, 1])


def test_reduce_add_sums_onto_the_destination_without_an_nccl_warning(two_devices):
    a, b = torch.arange(4.0, device="cuda:0"), torch.full((4,), 2.0, device="cuda:1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        total = comm.reduce_add([a, b], destination=1)
        assert torch.cuda.nccl.is_available([a, b])
    assert str(total.device) == "cuda:1" and total.tolist() == [2.0, 3.0, 4.0, 5.0]
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0] and b.tolist() == [2.0] * 4
    strided = comm.reduce_add([a.view(2, 2).t(), b.view(2, 2).t()], destination=0)
    assert str(strided.device) == "cuda:0" and strided.tolist() == [[2.0, 4.0], [3.0, 5.0]]
    sums = comm.reduce_add_coalesced([[a, a[:2]], [b, b[:2]]], destination=0)
    assert _where(sums) == ["cuda:0"] * 2 and sums[1].tolist() == [2.0, 3.0]


def test_scatter_keeps_views_on_the_source_device_and_copies_elsewhere(two_devices):
    x = torch.arange(4.0, device="cuda:0")
    chunks = comm.scatter(x, devices=[0, 1])
    assert _where(chunks) == ["cuda:0", "cuda:1"] and chunks[0].data_ptr() == x.data_ptr()
    assert [c.tolist() for c in chunks] == [[0.0, 1.0], [2.0, 3.0]]
    sized = comm.scatter(x, devices=[1, 0], chunk_sizes=[1, 3])
    assert _where(sized) == ["cuda:1", "cuda:0"] and sized[1].tolist() == [1.0, 2.0, 3.0]
    out = [torch.empty(1, device="cuda:1"), torch.empty(3, device="cuda:0")]
    assert comm.scatter(x, out=out)[0] is out[0] and out[1].tolist() == [1.0, 2.0, 3.0]
    streams = [torch.cuda.Stream(0), torch.cuda.Stream(0)]
    with pytest.raises(RuntimeError, match="Expected the device associated with the stream at "
                                           r"index 1 \(was 0\)"):
        comm.scatter(x, devices=[0, 1], streams=streams)


def test_gather_makes_one_tensor_on_the_destination(two_devices):
    a, b = torch.arange(2.0, device="cuda:0"), torch.full((2,), 5.0, device="cuda:1")
    for destination, where in ((1, "cuda:1"), (None, "cuda:0"), ("cpu", "cpu")):
        out = comm.gather([a, b], destination=destination)
        assert str(out.device) == where and out.tolist() == [0.0, 1.0, 5.0, 5.0]
    into = torch.empty(2, 2, device="cuda:1")
    assert comm.gather([a.view(2, 1), b.view(2, 1)], dim=1, out=into) is into
    with pytest.raises(RuntimeError, match="Expected all input tensors to be CUDA tensors"):
        comm.gather([a.cpu(), b])


def test_data_parallel_runs_forward_and_backward_over_two_devices(two_devices):
    torch.manual_seed(0)
    module = torch.nn.Linear(3, 2).cuda()
    x = torch.randn(4, 3, device="cuda")
    expected = module(x)
    y = torch.nn.DataParallel(module, device_ids=[0, 1])(x)
    assert str(y.device) == "cuda:0" and torch.allclose(y, expected)
    y.sum().backward()
    assert str(module.weight.grad.device) == "cuda:0"
    assert torch.allclose(module.weight.grad, x.sum(0).expand(2, 3))


def test_nccls_other_collectives_are_refused_by_name(two_devices):
    a, b = torch.ones(2, device="cuda:0"), torch.ones(2, device="cuda:1")
    with pytest.raises(UnsupportedOnEmulatedDevice, match=r"torch\._C\._nccl_all_reduce"):
        torch.cuda.nccl.all_reduce([a, b])
    with pytest.raises(UnsupportedOnEmulatedDevice, match=r"comms="):
        torch.cuda.nccl.reduce([a, b], comms=object())
