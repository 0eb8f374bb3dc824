"""Wrapper tensor subclasses made on the emulated device: torchao's quantized weights, DTensor,
a user's `torch.Tensor._make_wrapper_subclass(cls, shape, device=inner.device)`.

On CUDA the wrapper is a cuda tensor that owns no memory: `is_cuda` is True, every op on it reaches
its `__torch_dispatch__`, which runs the op on the tensors it wraps. A CPU build makes such a
wrapper too, on a "cuda" device no op of the emulated device takes, so a wrapper over device
tensors answered `is_cuda` False and an op mixing it with device tensors was refused as an op on
two devices. The wrapper is made on the cpu here, and marked device memory on the named device
with no allocation of its own, as CUDA's allocator makes none; the emulator's dispatch modes defer
to its `__torch_dispatch__` (harness/graphs/emulator/tensor_subclasses.py). torch's own tracing
subclasses are left as torch makes them.
"""

from __future__ import annotations

import torch

from harness import torch_internals
from harness.emulation import device_indices
from harness.emulation.rules import cuda_index, names_cuda
from harness.graphs.emulator.tensor_subclasses import is_users_subclass


def make_wrapper_subclass(state) -> staticmethod:
    """`torch.Tensor._make_wrapper_subclass` for the emulation's duration."""
    base = torch_internals.make_wrapper_subclass

    def _make_wrapper_subclass(cls, *args, **kwargs):
        device = kwargs.get("device")
        if device is None or not names_cuda(device) or not is_users_subclass(cls):
            return base(cls, *args, **kwargs)
        index = cuda_index(device, state.current_index, state.properties.count)
        wrapper = base(cls, *args, **{**kwargs, "device": torch.device("cpu")})
        storage = wrapper.untyped_storage()
        state.memory.mark_wrapper(storage)
        device_indices.set_storage_index(storage, index)
        return wrapper

    return staticmethod(_make_wrapper_subclass)


def legacy_subclass_constructor(state) -> staticmethod:
    """`torch.Tensor.__new__` for the emulation's duration. A subclass made by torch's legacy
    constructor (`Sub(2, 3)`, torch's own `CausalBias(variant, seq_len_q, seq_len_kv)` behind
    `causal_lower_right`) makes its tensor through `aten::empty`; once the device's dispatch
    modes were on (the stream tracking, from the first side stream), that op came back through a
    Python mode as a tensor that already had its Python object, and torch refused to make it the
    subclass ("Creating a new Tensor subclass ... already associated to a python object"), where
    CUDA, with no mode, makes it. The constructor makes host memory, which no mode of the device
    needs to see, so it runs with the modes set aside; a plain `torch.Tensor(...)` is unchanged."""
    base = torch.Tensor.__new__

    def __new__(cls, *args, **kwargs):
        if cls is torch.Tensor or not torch_internals.len_torch_dispatch_stack():
            return base(cls, *args, **kwargs)
        with torch_internals.disable_current_modes():
            return base(cls, *args, **kwargs)

    return staticmethod(__new__)
