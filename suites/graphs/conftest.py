"""Every graph-contract test runs on each backend available: the emulator always, real CUDA graphs
and the emulator on the GPU where CUDA is present. Test ids carry the backend
(`[emulated]`, `[cuda]`, `[emulated-cuda]`), which scripts/fidelity_table.py reads."""

from __future__ import annotations

import functools

import pytest
import torch

from harness.graphs import GraphBackend, get_backend
from harness.emulation import emulation_active

BACKEND_PARAMS = [
    pytest.param(("emulated", "cpu"), id="emulated"),
    pytest.param(("cuda", None), id="cuda", marks=pytest.mark.gpu),
    pytest.param(("emulated", "cuda"), id="emulated-cuda", marks=pytest.mark.gpu),
]


@functools.cache
def _warm_cuda() -> None:
    # cuBLAS and friends create handles and workspaces on first use; doing that inside a capture
    # is not allowed, so touch them once eagerly.
    a = torch.randn(8, 8, device="cuda")
    torch.softmax(a @ a, -1).topk(2)[0].sum() + torch.rand(8, device="cuda").sum()
    torch.cuda.synchronize()


@pytest.fixture(params=BACKEND_PARAMS)
def backend(request: pytest.FixtureRequest) -> GraphBackend:
    name, device = request.param  # the gpu mark of the cuda params skips them without CUDA
    if name == "cuda" and emulation_active() is not None:
        pytest.skip("real CUDA graphs: inside emulate_cuda() torch.cuda's graphs are the "
                    "emulator's; the [emulated-cuda] id runs it through torch.cuda.graph")
    if torch.cuda.is_available():
        _warm_cuda()
    return get_backend(name, device=device)


@pytest.fixture
def emulated() -> GraphBackend:
    return get_backend("emulated")
