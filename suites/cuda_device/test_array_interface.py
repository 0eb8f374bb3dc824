"""`torch.as_tensor` / `torch.tensor` / `torch.asarray` of an object exposing
`__cuda_array_interface__` over device memory, as TensorRT-LLM's `make_weak_ref` keeps its captured
graphs' outputs (a wrapper over `x.data_ptr()`, turned back with `torch.as_tensor(wrapper)`). The
emulated device refused it until 2026-12-06 ("Cannot initialize CUDA without ATen_cuda library");
the `cuda_kind` rows show CUDA's own answer on a GPU."""

from __future__ import annotations

import math

import pytest
import torch

_TYPESTR = {torch.float32: "<f4", torch.bfloat16: "<f2", torch.int64: "<i8"}


class Wrapper:
    """A data pointer with shape, dtype and element strides (TensorRT-LLM's TensorWrapper)."""

    def __init__(self, t: torch.Tensor, strides=None, read_only=False):
        self.ptr, self.dtype, self.shape = t.data_ptr(), t.dtype, tuple(t.shape)
        self.strides, self.read_only = strides, read_only

    @property
    def __cuda_array_interface__(self):
        size = torch.tensor([], dtype=self.dtype).element_size()
        return {"shape": self.shape, "typestr": _TYPESTR[self.dtype],
                "data": (self.ptr if math.prod(self.shape) else 0, self.read_only), "version": 3,
                "strides": None if self.strides is None else tuple(s * size for s in self.strides)}


def weak_ref(t: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(Wrapper(t, t.stride())).view(t.dtype)


def test_as_tensor_of_a_device_pointer_aliases_the_memory_without_owning_it(cuda_kind):
    x = torch.arange(12.0, device="cuda").view(3, 4)
    allocated = torch.cuda.memory_allocated()
    alias = weak_ref(x.t())
    assert torch.cuda.memory_allocated() == allocated
    assert alias.is_cuda and alias.device == x.device
    assert alias.data_ptr() == x.data_ptr() and alias.shape == (4, 3) and alias.stride() == (1, 4)
    x[0, 1] = 42.0
    assert alias[1, 0].item() == 42.0


def test_a_bfloat16_pointer_read_as_half_then_viewed_keeps_its_bits(cuda_kind):
    x = torch.linspace(-2, 2, 6, device="cuda", dtype=torch.bfloat16)
    alias = weak_ref(x)
    assert alias.dtype == torch.bfloat16
    assert torch.equal(alias, x)


def test_tensor_copies_and_the_call_s_dtype_and_device_apply(cuda_kind):
    x = torch.arange(4, device="cuda")
    copied = torch.tensor(Wrapper(x))
    assert copied.is_cuda and copied.data_ptr() != x.data_ptr()
    assert copied.tolist() == [0, 1, 2, 3]
    as_double = torch.as_tensor(Wrapper(x), dtype=torch.float64)
    assert as_double.is_cuda and as_double.dtype == torch.float64
    on_host = torch.as_tensor(Wrapper(x), device="cpu")
    assert on_host.device.type == "cpu" and on_host.tolist() == [0, 1, 2, 3]
    x.add_(10)
    assert copied.tolist() == [0, 1, 2, 3] and on_host.tolist() == [0, 1, 2, 3]


def test_a_weak_reference_to_a_captured_output_reads_each_replay(cuda_kind):
    static_in = torch.zeros(8, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        (static_in * 2 + 1).sum()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = static_in * 2 + 1
    weak = weak_ref(out)
    del out  # TensorRT-LLM keeps only the weak reference: the pool may reuse the block
    for value in (1.0, 5.0):
        static_in.fill_(value)
        graph.replay()
        torch.cuda.synchronize()
        assert weak.tolist() == [value * 2 + 1] * 8


def test_torch_s_checks_of_the_interface_hold(cuda_kind):
    x = torch.arange(4.0, device="cuda")
    with pytest.raises(TypeError, match="read only flag is not supported"):
        torch.as_tensor(Wrapper(x, read_only=True))

    class OddStrides(Wrapper):
        @property
        def __cuda_array_interface__(self):
            return {**super().__cuda_array_interface__, "strides": (2,)}  # float32 is 4 bytes

    with pytest.raises(ValueError, match="not a multiple of the element byte size"):
        torch.as_tensor(OddStrides(x))
