"""Sparse tensors on the emulated CUDA device (harness/emulation/device_memory.py): a sparse
tensor lives where its values do, and each of its parts (values, indices) is an allocation of the
device, as on CUDA. The `cuda_kind` rows run natively on a GPU to show CUDA's answer."""

from __future__ import annotations

import pytest
import torch

INDICES = [[0, 1, 1], [2, 0, 2]]
VALUES = [3.0, 4.0, 5.0]


def _coo(device=None):
    return torch.sparse_coo_tensor(torch.tensor(INDICES), torch.tensor(VALUES), (2, 3),
                                   device=device)


def _dense():
    return torch.tensor([[0.0, 0.0, 3.0], [4.0, 0.0, 5.0]])


def test_a_sparse_factory_naming_cuda_makes_a_device_tensor(cuda_kind):
    """Until 2026-12-07 the factory was refused by name (before stop 50 it handed back a cpu
    tensor, `is_cuda` False); CUDA makes a sparse tensor on the device, copying the parts."""
    indices, values = torch.tensor(INDICES), torch.tensor(VALUES)
    coo = torch.sparse_coo_tensor(indices, values, (2, 3), device="cuda")
    csr = torch.sparse_csr_tensor(torch.tensor([0, 1, 3]), torch.tensor([2, 0, 2]), values,
                                  (2, 3), device="cuda")
    for sparse in (coo, csr):
        assert sparse.is_cuda and sparse.device == torch.device("cuda", 0)
        assert sparse.to_dense().is_cuda
        assert torch.equal(sparse.to_dense().cpu(), _dense())
    assert not indices.is_cuda and not values.is_cuda  # the caller's parts stay host memory
    assert coo._values().is_cuda and coo._indices().is_cuda


def test_a_sparse_tensor_moves_to_the_device_and_back(cuda_kind):
    host = _coo()
    for moved in (host.cuda(), host.to("cuda"), host.to(device="cuda", dtype=torch.float64)):
        assert moved.is_cuda and moved.layout == torch.sparse_coo
        assert not host.is_cuda
        back = moved.cpu()
        assert not back.is_cuda and back._values().data_ptr() != moved._values().data_ptr()
        assert torch.equal(back.to_dense().float(), _dense())


def test_sparse_ops_on_the_device_give_device_tensors(cuda_kind):
    sparse = _coo("cuda")
    total = (sparse + sparse).coalesce()
    assert total.is_cuda and total.indices().is_cuda and total.values().is_cuda
    assert torch.equal(total.to_dense().cpu(), 2 * _dense())
    product = torch.sparse.mm(sparse, torch.ones(3, 2, device="cuda"))
    assert product.is_cuda and torch.equal(product.cpu(), _dense() @ torch.ones(3, 2))
    from_dense = _dense().cuda().to_sparse()
    assert from_dense.is_cuda and torch.equal(from_dense.to_dense(), _dense().cuda())
    csr = _dense().cuda().to_sparse_csr()
    assert csr.is_cuda and csr.crow_indices().is_cuda
    torch.testing.assert_close(sparse, sparse.clone())


def test_a_sparse_tensor_with_a_host_one_is_refused_as_on_cuda(cuda_kind):
    with pytest.raises(RuntimeError):
        _coo("cuda") + _coo()


def test_a_device_sparse_tensors_parts_are_device_allocations(cuda_kind):
    """Each part is an allocation of CUDA's caching allocator (512-byte blocks here: the values,
    then the indices)."""
    before = torch.cuda.memory_allocated()
    sparse = _coo("cuda")
    assert torch.cuda.memory_allocated() - before == 1024
    del sparse
    assert torch.cuda.memory_allocated() == before


def test_a_sparse_tensor_keeps_its_device(two_devices):
    sparse = _coo("cuda:1")
    assert sparse.device == torch.device("cuda", 1)
    assert (sparse * 2).device == torch.device("cuda", 1)
    assert sparse.to("cuda:0").device == torch.device("cuda", 0)


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_a_compiled_function_returns_a_device_sparse_tensor(cuda_kind, mode):
    """PyTorch's test_sparsity (cudagraph trees): dynamo cannot trace the sparse factory, and its
    graph break resumed the placement mode's traced call in the device's own frame, where the
    marker of device memory (an `aten.alias`) met the sparse tensor: "Cannot access storage of
    SparseTensorImpl"."""
    def make(indices, values):
        return torch.ops.aten._sparse_coo_tensor_with_dims_and_tensors(
            1, 1, [100, 4], indices, values, dtype=torch.float32, layout=torch.sparse_coo,
            device="cuda", pin_memory=None)

    torch._dynamo.reset()
    compiled = torch.compile(make, mode=mode)
    indices = torch.zeros([1, 7], dtype=torch.int64, device="cuda")
    values = torch.rand([7, 4], device="cuda")
    if cuda_kind == "sanitizer" and mode == "reduce-overhead":
        pytest.skip("the graph sanitizer refuses inductor's CUDA graphs by name")
    for _ in range(3):
        out = compiled(indices, values)
        assert out.is_cuda and out.layout == torch.sparse_coo
        torch.testing.assert_close(out, make(indices, values))
    torch._dynamo.reset()


def test_sparse_tensors_broadcast_coalesced_to_another_device(two_devices):
    """PyTorch's test_broadcast_coalesced and test_reduce_add_coalesced (test_cuda_multigpu.py),
    their sparse halves: `torch._C._broadcast` of a sparse tensor made a dense tensor on the other
    device and met "copy_() between dense and sparse Tensors is not implemented"."""
    from torch.cuda import comm

    tensors = [_coo("cuda"), torch.arange(5, device="cuda"), _coo("cuda").double()]
    copies = comm.broadcast_coalesced(tensors, (0, 1), buffer_size=64)
    for source, copy in zip(tensors, copies[1]):
        assert copy.device == torch.device("cuda", 1) and copy.layout == source.layout
        torch.testing.assert_close(copy.cpu(), source.cpu())
    sums = comm.reduce_add_coalesced([tensors, [t.cuda(1) for t in tensors]], destination=0,
                                     buffer_size=64)
    for source, total in zip(tensors, sums):
        assert total.device == torch.device("cuda", 0)
        torch.testing.assert_close(total.cpu(), (source * 2).cpu())


def test_a_sparse_op_on_a_side_stream_is_tracked_by_its_parts(cuda_device):
    """Stream tracking reads and writes a sparse tensor's parts (it read a storage the sparse
    tensor does not have: "Cannot access storage of SparseTensorImpl")."""
    side = torch.cuda.Stream()
    sparse = _coo("cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dense = (sparse + sparse).coalesce().to_dense()
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(dense.cpu(), 2 * _dense())


def test_a_sparse_op_inside_a_capture_is_refused_by_name(cuda_device):
    from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice

    sparse, ones = _coo("cuda"), torch.ones(3, 2, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(UnsupportedOnEmulatedDevice, match="sparse tensor inside a CUDA graph"):
        with torch.cuda.graph(graph):
            torch.sparse.mm(sparse, ones)
