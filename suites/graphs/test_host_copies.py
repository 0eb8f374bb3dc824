"""Copies from pageable host memory during capture. CUDA refuses them ("Cannot copy between CPU and
CUDA tensors during CUDA graph capture unless the CPU tensor is pinned"): `torch.tensor(data,
device=...)` and `buf.copy_(host_tensor)` alike; the emulator on a cuda device refuses them too,
naming the line, and so does the emulator on a cpu device, where it tells host tensors from device
tensors by how they were made (harness/graphs/emulator/host_tensors.py): any device argument (`x.device`,
"cpu") names the device; without one the code builds a host tensor, which CUDA refuses to move to
the device or to mix with device tensors during capture."""

from __future__ import annotations

import warnings

import pytest
import torch

from harness.graphs import CaptureError


def test_tensor_from_host_data_during_capture(backend):
    x = torch.ones(3, device=backend.device)

    def fn():
        return x + torch.tensor([1.0, 2.0, 3.0], device=x.device)

    with pytest.raises(CaptureError) as caught:
        backend.capture(fn)
    assert "pinned" in str(caught.value)
    assert "torch.tensor([1.0, 2.0, 3.0], device=x.device)" in str(caught.value)


@pytest.mark.parametrize("factory", [torch.as_tensor, torch.asarray])
def test_other_factories_from_host_data_during_capture(backend, factory):
    x = torch.ones(3, device=backend.device)
    with pytest.raises(CaptureError, match="pinned"):
        backend.capture(lambda: x + factory([1.0, 2.0, 3.0], device=x.device))


def test_a_host_scalar_from_host_data_on_a_cpu_device(emulated):
    # Without a device the code asks for a host tensor; a 0-dim one is a value to CUDA's ops.
    x = torch.ones(3)

    def fn():
        return x * torch.tensor(2.0)

    with pytest.warns(UserWarning, match=r"built from Python data during capture.*test_host_copies\.py"):
        graph = emulated.capture(fn)
    graph.replay()
    assert torch.equal(graph.output, torch.full((3,), 2.0))


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")], ids=["string", "torch.device"])
def test_any_device_argument_names_the_device(emulated, device):
    # On the emulator's cpu device "cpu" stands where code adapted from CUDA had "cuda".
    x = torch.ones(3)
    graph = emulated.capture(lambda: x + torch.arange(3, device=device) + torch.ones(3, device=device))
    graph.replay()
    assert torch.equal(graph.output, torch.tensor([2.0, 3.0, 4.0]))
    with pytest.raises(CaptureError, match="pinned"):
        emulated.capture(lambda: x + torch.tensor([1.0, 2.0, 3.0], device=device))


def _rope_recomputed_in_forward(x: torch.Tensor) -> torch.Tensor:
    # transformers 5.17's Phi-MoE rotary embedding: frequencies rebuilt on the host at every
    # forward, then moved to the device.
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float) / 8))
    return x * inv_freq[None, :].expand(x.shape[0], -1).to(dtype=torch.float, device=x.device)


def test_a_host_tensor_moved_to_the_device_during_capture(backend):
    x = torch.ones(2, 4, device=backend.device)
    with pytest.raises(CaptureError, match="pinned") as caught:
        backend.capture(lambda: _rope_recomputed_in_forward(x))
    assert "inv_freq[None, :].expand" in str(caught.value)


def test_a_host_tensor_given_to_an_op_with_device_tensors(emulated):
    # On CUDA an op refuses tensors of two devices (an index is copied, which capture refuses).
    x = torch.ones(2, 4)
    with pytest.raises(CaptureError, match=r"^Expected all tensors to be on the same device, but "
                                           r"found at least two devices(?s:.*)host tensor of "
                                           r"shape \(2,\)"):
        emulated.capture(lambda: x[:, torch.arange(2)])
    with pytest.raises(CaptureError, match=r"host tensor of shape \(4,\)"):
        emulated.capture(lambda: x + torch.ones(4) * 2)


def test_host_work_during_capture_and_device_factories_capture(emulated):
    x = torch.ones(4)

    def fn():
        steps = torch.arange(4) * 2  # host tensors alone: host work, as on CUDA
        steps = steps.to(torch.float32).to(steps)  # dtype casts, and to another host tensor
        with torch.device("cpu"):  # a device context names the device
            ramp = torch.arange(4)
        return steps, x + ramp + torch.arange(4, device=x.device) + steps.sum()

    graph = emulated.capture(fn)
    graph.replay()
    assert torch.equal(graph.output[1], torch.tensor([13.0, 15.0, 17.0, 19.0]))


def test_as_tensor_of_a_device_tensor_is_no_host_copy(backend):
    x = torch.ones(3, device=backend.device)
    graph = backend.capture(lambda: torch.as_tensor(x * 2, device=x.device) + 1)
    graph.replay()
    backend.synchronize()
    assert torch.equal(graph.output, torch.full((3,), 3.0, device=backend.device))


def _assignment_copies_a_host_scalar() -> bool:
    """Whether `y[index] = 1.0` reaches ATen as index_put_ with a 0-dim host tensor (torch up to
    2.14) or as index_fill_ with the scalar as an argument (torch 2.15): only the first copies."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class _Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    y = torch.zeros(4)
    with _Ops():
        y[torch.tensor([1, 3])] = 1.0
    return torch.ops.aten.index_put_.default in seen


def test_a_scalar_assigned_by_integer_index(backend):
    # Where `y[index] = 1.0` copies a 0-dim host tensor to the device, CUDA refuses that copy
    # during capture; where torch passes the scalar as a kernel argument there is nothing to refuse.
    # On a cpu device there is no copy either way, and the emulator neither refuses nor warns.
    x = torch.zeros(4, device=backend.device)
    index = torch.tensor([1, 3], device=backend.device)

    def fn():
        y = x * 1
        y[index] = 1.0
        return y

    if backend.device.type == "cuda" and _assignment_copies_a_host_scalar():
        with pytest.raises(CaptureError, match="pinned") as caught:
            backend.capture(fn)
        assert "y[index] = 1.0" in str(caught.value)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        graph = backend.capture(fn)
    graph.replay()
    assert torch.equal(graph.output.cpu(), torch.tensor([0.0, 1.0, 0.0, 1.0]))


def test_index_fill_with_a_scalar_is_no_host_copy(backend):
    # The remedy the refusal above names: the scalar travels as a kernel argument, on every device.
    x = torch.zeros(4, device=backend.device)
    index = torch.tensor([1, 3], device=backend.device)
    graph = backend.capture(lambda: (x * 1).index_fill_(0, index, 1.0))
    index.copy_(torch.tensor([0, 2]))
    graph.replay()
    backend.synchronize()
    assert torch.equal(graph.output, torch.tensor([1.0, 0.0, 1.0, 0.0], device=backend.device))


def test_a_host_scalar_tensor_is_a_value_on_a_cuda_device(backend):
    # A 0-dim host tensor given to an op on a cuda device goes into the kernel's arguments when
    # capture meets it: later writes to it, or dropping it, do not reach the graph. On a cpu device
    # it is device memory like any other, read at every replay.
    x = torch.ones(3, device=backend.device)
    scale = torch.tensor(2.0)
    graph = backend.capture(lambda: x * scale + scale)
    scale.fill_(5.0)
    if backend.device.type == "cuda":
        del scale
        graph.replay()
        backend.synchronize()
        assert torch.equal(graph.output, torch.full((3,), 4.0, device=backend.device))
        return
    graph.replay()
    assert torch.equal(graph.output, torch.full((3,), 10.0))


def test_copy_from_a_pageable_host_tensor(backend):
    host = torch.arange(4.0)
    buffer = torch.zeros(4, device=backend.device)

    def fn():
        buffer.copy_(host)
        return buffer * 2

    if backend.device.type == "cuda":
        with pytest.raises(CaptureError, match="pinned"):
            backend.capture(fn)
        return
    graph = backend.capture(fn)  # host memory is device memory on a cpu device
    host.fill_(1.0)
    graph.replay()
    assert torch.equal(graph.output, torch.full((4,), 2.0))


@pytest.mark.gpu
def test_copy_from_pinned_host_memory_is_capturable(backend):
    if backend.device.type != "cuda":
        pytest.skip("pinned memory is for copies to a cuda device")
    host = torch.arange(4.0).pin_memory()
    buffer = torch.zeros(4, device=backend.device)

    def fn():
        buffer.copy_(host, non_blocking=True)
        return buffer * 2

    graph = backend.capture(fn)
    host.fill_(3.0)
    graph.replay()
    backend.synchronize()
    assert torch.equal(graph.output, torch.full((4,), 6.0, device=backend.device))


class EagerMaskedAttention(torch.nn.Module):
    """Single-head attention with an additive causal mask built the way transformers' eager mask
    code built it: a `torch.tensor(0.0, device=mask.device, dtype=dtype)` in a `torch.where`."""

    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        n = x.shape[1]
        allowed = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        mask = torch.where(allowed, torch.tensor(0.0, device=allowed.device, dtype=x.dtype),
                           torch.finfo(x.dtype).min)
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + mask
        return scores.softmax(-1) @ v


def test_eager_attention_mask_built_from_host_data(backend):
    # transformers 5.17's eager mask; the H200 audit found the emulator keeping it on a cpu device
    # (agrees) where CUDA refused it (capture error).
    torch.manual_seed(0)
    model = EagerMaskedAttention().to(backend.device)
    x = torch.randn(2, 5, 16, device=backend.device)
    with torch.no_grad(), pytest.raises(CaptureError, match="pinned") as caught:
        backend.capture(lambda: model(x))
    assert "torch.tensor(0.0, device=allowed.device" in str(caught.value)
