"""`torch.use_deterministic_algorithms(True)` on the device: CUDA's kernels without a deterministic
form alert (`Context::alertNotDeterministic`: a RuntimeError naming the kernel, or a warning under
`warn_only=True`), checked inside the CUDA kernels or behind a CUDA device-type test. The emulated
device ran the CPU's kernels, which have deterministic forms, and never alerted: `histc`, a weighted
`bincount`, `median` along a dimension, `put_` accumulating, a `scatter_reduce` product, a 2-D
`nll_loss`, and the backward of bicubic interpolation, adaptive average pooling, reflection
padding, `grid_sample` and a max `embedding_bag` ran on the CPU and raised on a GPU.

What CUDA runs deterministically stays quiet, as measured on an NVIDIA H100 (torch 2.11.0+cu130,
2026-12-07), where an earlier reading of older sources had the emulated device alert: a float
`cumsum` and `multinomial` of several samples with replacement (cumsum is deterministic now), a
cuBLAS matmul without CUBLAS_WORKSPACE_CONFIG (the check is gone from torch), and the backward of
bilinear interpolation and replicate padding, whose Python body takes a deterministic
decomposition on a CUDA input (the emulated device's body saw a cpu tensor and took the kernel
whose backward alerts). A direct call of the bilinear backward kernel still alerts.
The `cuda_kind` rows show CUDA's own verdicts on a GPU."""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F

from suites.cuda_device._own_process import in_a_process_of_its_own

Call = Callable[[torch.Tensor], object]


def _backward(forward: Callable[[torch.Tensor], torch.Tensor]) -> Call:
    def call(x: torch.Tensor) -> None:
        leaf = x.detach().requires_grad_()
        forward(leaf).sum().backward()
    return call


def _ids(x: torch.Tensor) -> torch.Tensor:
    return (x.abs() * 10).long().remainder(4).flatten()


# name: (the caller CUDA's alert names, the call on a 4x16 float input `x`)
ALERTED: dict[str, tuple[str, Call]] = {
    "histc": ("_histc_cuda with floating point input", lambda x: torch.histc(x, 4, -1, 1)),
    "bincount with weights": ("_bincount_cuda", lambda x: torch.bincount(_ids(x), x.flatten())),
    "median along a dimension": ("median CUDA with indices output", lambda x: torch.median(x, 1)),
    "nanmedian along a dimension":
        ("median CUDA with indices output", lambda x: torch.nanmedian(x, 1)),
    "put_ accumulating": ("put_", lambda x: x.clone().put_(_ids(x)[:8], x[0, :8], accumulate=True)),
    "scatter_reduce of a product": ("scatter_reduce_cuda_prod_", lambda x: torch.ones(
        4, device=x.device).scatter_reduce(0, _ids(x), x.flatten(), "prod")),
    "cross_entropy of 4-d scores": ("nll_loss2d_forward_out_cuda_template", lambda x: F.cross_entropy(
        x.view(1, 4, 4, 4), _ids(x)[:16].view(1, 4, 4))),
    "bilinear backward kernel called directly": (
        "upsample_bilinear2d_backward_out_cuda",
        lambda x: torch.ops.aten.upsample_bilinear2d_backward(
            torch.ones(1, 1, 8, 32, device=x.device), [8, 32], [1, 1, 4, 16], False)),
    "bicubic interpolation's backward": ("upsample_bicubic2d_backward_out_cuda", _backward(
        lambda x: F.interpolate(x.view(1, 1, 4, 16), scale_factor=2, mode="bicubic"))),
    "adaptive_avg_pool2d's backward": ("adaptive_avg_pool2d_backward_cuda", _backward(
        lambda x: F.adaptive_avg_pool2d(x.view(1, 1, 4, 16), 3))),
    "reflection padding's backward": ("reflection_pad1d_backward_out_cuda", _backward(
        lambda x: F.pad(x.view(1, 4, 16), (2, 2), mode="reflect"))),
    "grid_sample's backward": ("grid_sampler_2d_backward_cuda", _backward(
        lambda x: F.grid_sample(x.view(1, 1, 4, 16), x[0, :8].reshape(1, 2, 2, 2).tanh(),
                                align_corners=False))),
    "embedding_bag max's backward": ("embedding_bag_backward_cuda_max", _backward(
        lambda x: F.embedding_bag(_ids(x)[:8].view(2, 4), x, mode="max"))),
}
QUIET: dict[str, Call] = {
    "cumsum of floats": lambda x: torch.cumsum(x, 1),
    "cumsum of a 1-d float tensor": lambda x: torch.cumsum(x.flatten(), 0),
    "multinomial of 3 samples with replacement":
        lambda x: torch.multinomial(x.softmax(1), 3, replacement=True),
    "bilinear interpolation's backward": _backward(
        lambda x: F.interpolate(x.view(1, 1, 4, 16), scale_factor=2, mode="bilinear")),
    "replicate padding's backward": _backward(
        lambda x: F.pad(x.view(1, 4, 16), (2, 2), mode="replicate")),
    "cumsum of integers": lambda x: torch.cumsum(_ids(x), 0),
    "histc of integers": lambda x: torch.histc(_ids(x), 4, 0, 8),  # integer atomics are exact
    "multinomial of 1 sample with replacement":
        lambda x: torch.multinomial(x.softmax(1), 1, replacement=True),
    "multinomial without replacement": lambda x: torch.multinomial(x.softmax(1), 3),
    "bincount without weights": lambda x: torch.bincount(_ids(x)),
    "median of all values": lambda x: torch.median(x),
    "scatter_reduce of a sum": lambda x: torch.zeros(4, device=x.device).scatter_reduce(
        0, _ids(x), x.flatten(), "sum"),
    "index_add": lambda x: torch.zeros(4, 16, device=x.device).index_add(0, _ids(x)[:4], x),
    "scatter_add_": lambda x: torch.zeros(4, device=x.device).scatter_add_(0, _ids(x), x.flatten()),
    "cross_entropy of 2-d scores": lambda x: F.cross_entropy(x, _ids(x)[:4]),
    "nearest interpolation's backward": _backward(
        lambda x: F.interpolate(x.view(1, 1, 4, 16), scale_factor=2, mode="nearest")),
}
DOES_NOT = "does not have a deterministic implementation, but you set 'torch.use_deterministic_algorithms(True"


@contextlib.contextmanager
def _deterministic(warn_only: bool = False) -> Iterator[None]:
    was, was_warn_only = (torch.are_deterministic_algorithms_enabled(),
                          torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn_only)


def _input() -> torch.Tensor:
    return torch.randn(4, 16, generator=torch.Generator().manual_seed(0)).to("cuda")


@pytest.mark.parametrize("name", sorted(ALERTED))
def test_a_kernel_without_a_deterministic_form_raises_cudas_alert(cuda_kind, name):
    caller, call = ALERTED[name]
    x = _input()
    with _deterministic(), pytest.raises(RuntimeError) as raised:
        call(x)
    assert str(raised.value).startswith(f"{caller} {DOES_NOT})'."), raised.value
    call(x)  # the mode off, the call runs


@pytest.mark.parametrize("name", ["histc", "bicubic interpolation's backward"])
def test_warn_only_warns_with_cudas_words_and_runs(cuda_kind, name):
    caller, call = ALERTED[name]
    x = _input()
    with _deterministic(warn_only=True), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call(x)
    texts = [str(w.message) for w in caught]
    assert any(t.startswith(f"{caller} {DOES_NOT}, warn_only=True)'.") for t in texts), texts


@pytest.mark.parametrize("name", sorted(QUIET))
def test_an_op_cuda_runs_deterministically_stays_quiet(cuda_kind, name):
    x = _input()
    with _deterministic(), warnings.catch_warnings():
        warnings.simplefilter("error")
        QUIET[name](x)


def test_host_tensors_keep_the_cpus_deterministic_kernels(cuda_kind):
    x = _input().cpu()
    with _deterministic():
        assert torch.cumsum(x, 1).shape == (4, 16)
        assert torch.histc(x, 4, -1, 1).sum().item() <= 64



MATMULS: dict[str, Call] = {
    "mm": lambda x: x @ x.mT,
    "linear": lambda x: F.linear(x, x, x[0, :4]),
    "bmm": lambda x: torch.bmm(x.view(2, 2, 16), x.view(2, 16, 2)),
    "mv": lambda x: torch.mv(x, x[0]),
}


def _matmul_outcome(name: str) -> tuple[str, list[str]]:
    """A matmul under the deterministic mode without CUBLAS_WORKSPACE_CONFIG (unset before the
    process's first gemm): "ran" or the error's text, and the warnings' texts."""
    was = os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    try:
        x = _input()
        with _deterministic(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                MATMULS[name](x)
                outcome = "ran"
            except RuntimeError as error:
                outcome = str(error)
        return outcome, [str(w.message) for w in caught]
    finally:
        if was is not None:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = was


@pytest.mark.parametrize("name", sorted(MATMULS))
def test_a_cublas_matmul_runs_without_a_workspace_config(cuda_kind, name):
    outcome, warned = (_matmul_outcome(name) if cuda_kind == "emulated"
                       else in_a_process_of_its_own(__file__, "_matmul_outcome", name))
    assert outcome == "ran" and not any("CUBLAS_WORKSPACE_CONFIG" in w for w in warned), (
        outcome, warned)


@pytest.mark.parametrize("name, forward, kernels_node", [
    ("bilinear", lambda x: F.interpolate(x.view(1, 1, 4, 16), scale_factor=2, mode="bilinear"),
     "UpsampleBilinear2DBackward0"),
    ("replicate", lambda x: F.pad(x.view(1, 4, 16), (2, 2), mode="replicate"),
     "ReplicationPad1DBackward0"),
])
def test_a_python_body_takes_cudas_deterministic_branch(cuda_kind, name, forward, kernels_node):
    """torch's Python body asks its input's device: on CUDA under the mode it takes the
    decomposition (its autograd node not the kernel's), without the mode the kernel."""
    leaf = _input().requires_grad_()
    with _deterministic():
        under_the_mode = type(forward(leaf).grad_fn).__name__
    assert under_the_mode != kernels_node
    assert type(forward(leaf).grad_fn).__name__ == kernels_node
