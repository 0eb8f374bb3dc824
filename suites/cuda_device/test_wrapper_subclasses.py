"""Wrapper tensor subclasses on the device: a weight held as int8 values and a scale per row,
dequantized in its own `__torch_dispatch__` (torchao's quantized weights, as gpt-fast, SGLang and
transformers' TorchAoConfig load them; DTensor is made the same way). On CUDA the wrapper is a
cuda tensor that owns no memory, and every op on it runs on the tensors it holds. The emulated
device made the wrapper on a "cuda" device of the CPU build that none of its ops took: `is_cuda`
was False, an op of the wrapper with a device tensor was refused as an op on two devices, the
tensors of a wrapper an op returned were host memory, and a compiled call over it failed. The
rows run natively on a GPU too."""

from __future__ import annotations

import pytest
import torch


class Int8Rows(torch.Tensor):
    """int8 values and a float scale per row; any op sees the dequantized float weight."""

    @staticmethod
    def __new__(cls, values: torch.Tensor, scales: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(cls, values.shape, dtype=scales.dtype,
                                                   device=values.device)

    def __init__(self, values: torch.Tensor, scales: torch.Tensor) -> None:
        self.values, self.scales = values, scales

    def __repr__(self) -> str:
        return f"Int8Rows({tuple(self.shape)})"

    def __tensor_flatten__(self):
        return ["values", "scales"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return Int8Rows(inner["values"], inner["scales"])

    def dequantized(self) -> torch.Tensor:
        return self.values.to(self.scales.dtype) * self.scales[:, None]

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.ops.aten.detach.default, torch.ops.aten.clone.default):
            return Int8Rows(func(args[0].values), func(args[0].scales))
        if func is torch.ops.aten._to_copy.default:
            moved = {k: v for k, v in kwargs.items() if k != "dtype"}
            return Int8Rows(func(args[0].values, **moved), func(args[0].scales, **kwargs))
        plain = [a.dequantized() if isinstance(a, Int8Rows) else a for a in args]
        return func(*plain, **kwargs)


def _weights():
    gen = torch.Generator().manual_seed(0)
    values = torch.randint(-100, 100, (16, 16), dtype=torch.int8, generator=gen)
    scales = torch.rand(16, generator=gen) / 50
    return values, scales


def test_a_wrapper_over_device_tensors_is_a_device_tensor(cuda_kind):
    values, scales = _weights()
    weight = Int8Rows(values.cuda(), scales.cuda())
    assert weight.is_cuda and weight.device == torch.device("cuda", 0)
    x = torch.randn(4, 16, device="cuda")
    y = torch.nn.functional.linear(x, weight)  # refused as an op on two devices before
    assert y.is_cuda
    assert torch.allclose(y.cpu(), x.cpu() @ (values.float() * scales[:, None]).t(), atol=1e-4)


def test_the_tensors_of_a_wrapper_an_op_returns_are_device_memory(cuda_kind):
    values, scales = _weights()
    moved = Int8Rows(values, scales).cuda()  # a host weight moved, as Module.cuda() moves it
    assert type(moved) is Int8Rows and moved.values.is_cuda and moved.scales.is_cuda
    copied = moved.clone()
    assert copied.values.is_cuda and copied.scales.is_cuda
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    aliased = Int8Rows(moved.values, moved.scales)  # a wrapper owns no memory of its own
    assert aliased.is_cuda and torch.cuda.memory_allocated() == before


def test_a_module_with_a_wrapper_weight_replays_its_capture(cuda_kind):
    values, scales = _weights()
    linear = torch.nn.Linear(16, 16, bias=False)
    linear.weight = torch.nn.Parameter(Int8Rows(values, scales), requires_grad=False)
    linear = linear.cuda()
    x = torch.randn(4, 16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        linear(x)  # warm-up
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = linear(x)
    x.copy_(torch.randn(4, 16, device="cuda"))
    linear.weight.scales.mul_(2)  # new scales written in place, read by the replay
    graph.replay()
    torch.cuda.synchronize()
    expected = x.cpu() @ (values.float() * 2 * scales[:, None]).t()
    assert torch.allclose(y.cpu(), expected, atol=1e-4)


def test_a_compiled_call_over_a_wrapper_weight_replays_new_inputs(cuda_kind):
    if cuda_kind == "sanitizer":
        pytest.skip("the graph sanitizer refuses inductor's CUDA graphs by name")
    torch._dynamo.reset()
    values, scales = _weights()
    linear = torch.nn.Linear(16, 16, bias=False)
    linear.weight = torch.nn.Parameter(Int8Rows(values, scales), requires_grad=False)
    linear = linear.cuda()
    step = torch.compile(linear, mode="reduce-overhead")
    weight = values.float() * scales[:, None]
    try:
        for _ in range(4):  # warm-up, recording, replays
            x = torch.randn(4, 16, device="cuda")
            assert torch.allclose(step(x).cpu(), x.cpu() @ weight.t(), atol=1e-4)
    finally:
        torch._dynamo.reset()


class _Sized(torch.Tensor):
    """A subclass made by torch's legacy constructor, as torch's CausalBias is."""


def test_a_subclass_of_the_legacy_constructor_is_made_once_streams_are_tracked(cuda_kind):
    """The first side stream turns the device's stream tracking on, a dispatch mode; the legacy
    constructor's tensor then came back through it with a Python object of its own, and torch
    refused to make it the subclass. CUDA runs no mode and makes it."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.ones(4, device="cuda").mul_(2)
    torch.cuda.current_stream().wait_stream(side)
    made = _Sized(2, 3)
    assert type(made) is _Sized and made.shape == (2, 3) and not made.is_cuda
    assert type(torch.Tensor(2, 3)) is torch.Tensor
