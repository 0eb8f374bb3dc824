"""Calls the CPU build runs and CUDA has no kernel for: `torch.histogram` and `torch.histogramdd`
have CPU kernels only (their dispatch tables on the CUDA wheels of torch 2.11 to 2.15), so a GPU
refuses them for cuda tensors with the dispatcher's NotImplementedError. The emulated device ran
them on the CPU's kernels and answered. Host calls keep their answer; `histc` is CUDA's counting
op. The `cuda_kind` rows show CUDA's own answer on a GPU."""

from __future__ import annotations

import pytest
import torch

CALLS = {
    "torch.histogram of int bins": ("aten::histogram.bin_ct", lambda x: torch.histogram(x, bins=4)),
    "Tensor.histogram": ("aten::histogram.bin_ct", lambda x: x.histogram(4)),
    "torch.histogram of a bins tensor": (
        "aten::histogram.bins_tensor",
        lambda x: torch.histogram(x, bins=torch.linspace(-3, 3, 5, device=x.device))),
    "torch.histogramdd": ("aten::_histogramdd_bin_edges",
                          lambda x: torch.histogramdd(x.view(4, 2), bins=[2, 2])),
    # the aten ops called themselves, as compiled code and decompositions call them
    "aten.histogram packet": ("aten::histogram.bin_ct",
                              lambda x: torch.ops.aten.histogram(x, 4)),
    "aten.histogram.bin_ct": ("aten::histogram.bin_ct",
                              lambda x: torch.ops.aten.histogram.bin_ct(x, 4)),
    "aten.histogram.bins_tensor": (
        "aten::histogram.bins_tensor",
        lambda x: torch.ops.aten.histogram.bins_tensor(x, torch.linspace(-3, 3, 5,
                                                                         device=x.device))),
    "aten._histogramdd_bin_edges": (
        "aten::_histogramdd_bin_edges",
        lambda x: torch.ops.aten._histogramdd_bin_edges(x.view(4, 2), [2, 2])),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_call_cuda_has_no_kernel_for_is_refused_by_the_dispatcher(cuda_kind, name):
    op, call = CALLS[name]
    x = torch.linspace(-2, 2, 8, device="cuda")
    with pytest.raises(NotImplementedError,
                       match=f"Could not run '{op}' with arguments from the 'CUDA' backend"):
        call(x)


def test_the_same_calls_on_host_tensors_answer_and_histc_counts_on_the_device(cuda_kind):
    x = torch.linspace(-2, 2, 8)
    assert torch.histogram(x, bins=4).hist.tolist() == [2.0, 2.0, 2.0, 2.0]
    assert torch.histogramdd(x.view(4, 2), bins=[2, 2]).hist.sum().item() == 4.0
    counts = torch.histc(x.to("cuda"), bins=4, min=-2, max=2)
    assert counts.is_cuda and counts.cpu().tolist() == [2.0, 2.0, 2.0, 2.0]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_code_meets_the_missing_kernel_too(cuda_kind, backend):
    """A compiled graph runs its aten ops with the placement mode off the stack
    (compiled_graphs.py): CUDA's dispatcher refuses the CPU-only op there as well."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: torch.histogram(t, bins=4).hist * 2, backend=backend)
    with pytest.raises(NotImplementedError, match="Could not run 'aten::histogram"):
        compiled(torch.linspace(-2, 2, 8, device="cuda"))
    torch._dynamo.reset()


def test_sparse_mm_with_a_reduction_is_refused_and_without_one_runs(cuda_kind):
    """`torch.sparse.mm(csr, dense, reduce)` reaches `_sparse_mm_reduce_impl`, a SparseCsrCPU
    kernel only: a GPU refuses it for a cuda CSR tensor (the op database's `sparse.mm.reduce`
    row on an H100); without `reduce` the product has CUDA's kernel."""
    csr = torch.eye(3, device="cuda").to_sparse_csr()
    dense = torch.ones(3, 2, device="cuda")
    assert torch.sparse.mm(csr, dense).to_dense().cpu().tolist() == [[1.0, 1.0]] * 3
    with pytest.raises(NotImplementedError,
                       match="Could not run 'aten::_sparse_mm_reduce_impl' with arguments from "
                             "the 'SparseCsrCUDA' backend"):
        torch.sparse.mm(csr, dense, "sum")
    assert torch.sparse.mm(csr.cpu(), dense.cpu(), "sum").tolist() == [[1.0, 1.0]] * 3
