"""torch.func on the emulated device: vmap's batched tensors and grad's wrappers have no storage of
their own, so the device answers for the tensors they wrap (flex attention's eager path builds its
block masks under vmap, on the query's device)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(params=["untracked", "tracked"])
def device(request, cuda_device):
    """The emulated device before stream tracking starts, and after: a stream made turns it on
    (every runtime that captures makes one), and tracking keys calls by their tensors' storages."""
    if request.param == "tracked":
        torch.cuda.Stream()
    return cuda_device


def test_vmap_over_device_tensors_stays_on_the_device(device):
    x = torch.randn(3, 4, device="cuda")
    w = torch.randn(4, device="cuda")
    seen = []

    def row_dot(row):
        seen.append(row.is_cuda)
        return (row * w).sum()

    y = torch.vmap(row_dot)(x)
    assert seen == [True] and y.is_cuda
    torch.testing.assert_close(y, x @ w)


def test_vmap_mixing_a_host_tensor_is_refused_as_on_cuda(device):
    x = torch.randn(3, 4, device="cuda")
    host = torch.randn(4)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.vmap(lambda row: row * host)(x)


def test_grad_of_a_device_function_is_a_device_tensor(device):
    w = torch.randn(4, device="cuda")
    g = torch.func.grad(lambda v: (v * v).sum())(w)
    assert g.is_cuda
    torch.testing.assert_close(g, 2 * w)


def test_flex_attention_eager_matches_sdpa(device):
    from torch.nn.attention.flex_attention import flex_attention

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 16, generator=gen).to("cuda") for _ in range(3))
    out = flex_attention(q, k, v)
    assert out.is_cuda
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v))


def test_vmap_inside_a_capture_is_refused_by_name(device):
    """A documented difference (docs/fidelity.md): CUDA captures the kernels vmap launches; the
    emulated graph cannot record ops on its storage-less batched tensors, and says so."""
    from harness.graphs.base import CaptureError

    x = torch.randn(3, 4, device="cuda")
    w = torch.randn(4, device="cuda")
    batched = torch.vmap(lambda row: (row * w).sum())
    batched(x)  # warmup, as code written for CUDA does
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(CaptureError, match="a torch.func transform .* inside a capture"):
        with torch.cuda.graph(graph):
            batched(x)
