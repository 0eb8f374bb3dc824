"""`torch.as_tensor(obj)`, `torch.tensor(obj)` and `torch.asarray(obj)` of an object that is not a
tensor but exposes `__cuda_array_interface__` (a raw device pointer with shape, typestr and byte
strides). CUDA's torch wraps the pointer as a cuda tensor that does not own the memory
(`tensor_from_cuda_array_interface`: `at::from_blob` on the device), then applies the call's
dtype, device and copy. Runtimes make weak references to their captured graphs' outputs so
(TensorRT-LLM's and TransformerEngine's `make_weak_ref`: a wrapper over `x.data_ptr()` turned back
into a tensor with `torch.as_tensor(wrapper)`), so the pool can reuse the output's block. A CPU
build refused it ("Cannot initialize CUDA without ATen_cuda library"); on the emulated device the
pointer names host bytes marked as device memory, so it is the same storage-less alias that
`torch._C._construct_storage_from_data_pointer` makes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy
import torch

from harness.emulation import device_indices
from harness.emulation.storages import storage_from_data_pointer

Tensor = torch.Tensor


def exposes_interface(obj: Any) -> bool:
    """True for a non-tensor with `__cuda_array_interface__` (torch takes a tensor's own path
    first, so a tensor's interface is never read here)."""
    return not isinstance(obj, Tensor) and hasattr(obj, "__cuda_array_interface__")


def alias_of(state, obj: Any) -> Tensor:
    """The device tensor over the memory `obj.__cuda_array_interface__` describes, owning none of
    it, with torch's checks and messages (tensor_numpy.cpp)."""
    spec = obj.__cuda_array_interface__
    if not isinstance(spec, dict):
        raise TypeError("`__cuda_array_interface__` must be a dict")
    if "shape" not in spec:
        raise TypeError("attribute `shape` must exist")
    shape = [int(s) for s in spec["shape"]]
    if "typestr" not in spec:
        raise TypeError("attribute `typestr` must exist")
    try:
        np_dtype = numpy.dtype(spec["typestr"])
    except TypeError as error:
        raise ValueError("cannot parse `typestr`") from error
    dtype = torch.from_numpy(numpy.empty(0, dtype=np_dtype)).dtype
    itemsize = np_dtype.itemsize
    data = spec.get("data")
    if data is None:
        raise TypeError("attribute `shape` data exist")  # torch's own words
    if not isinstance(data, tuple) or len(data) != 2:
        raise TypeError("`data` must be a 2-tuple of (int, bool)")
    pointer, read_only = int(data[0]), bool(data[1])
    if read_only:
        raise TypeError("the read only flag is not supported, should always be False")
    byte_strides = spec.get("strides")
    if byte_strides is None:
        strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    else:
        byte_strides = list(byte_strides)
        if len(byte_strides) != len(shape):
            raise TypeError("strides must be a sequence of the same length as shape")
        if any(int(s) % itemsize for s in byte_strides):
            raise ValueError("given array strides not a multiple of the element byte size. "
                             "Make a copy of the array to reallocate the memory.")
        strides = [int(s) // itemsize for s in byte_strides]
    numel = math.prod(shape)
    extent = 0 if numel == 0 else itemsize * (1 + sum((n - 1) * s for n, s in zip(shape, strides)))
    index = state.current_index
    storage = storage_from_data_pointer(state)(pointer, torch.device("cuda", index), extent)
    tensor = torch.empty(0, dtype=dtype).set_(storage, 0, shape, strides)
    device_indices.set_index(tensor, index)
    return tensor


def handler(mode):
    """The placement mode's handler of torch.as_tensor / torch.tensor / torch.asarray: an object
    with the interface becomes its alias, then the call's dtype, device and copy apply, as
    `internal_new_from_data` does (`tensor.to(device, dtype, copy=...)`); anything else goes the
    generic way."""

    def from_data(func, args, kwargs):
        key = "obj" if func is torch.asarray else "data"
        obj = args[0] if args else kwargs.get(key)
        if not exposes_interface(obj):
            return mode._generic(func, args, kwargs)
        kwargs = {k: v for k, v in kwargs.items() if k != key}
        if kwargs.get("pin_memory"):
            raise RuntimeError("Can't pin tensor constructed from __cuda_array_interface__")
        alias = alias_of(mode.state, obj)
        copy = func is torch.tensor or bool(kwargs.get("copy"))
        device = kwargs.get("device")
        to_kwargs = {"device": torch.device("cuda", mode.state.current_index) if device is None
                     else device,
                     "dtype": kwargs.get("dtype") or alias.dtype, "copy": copy}
        out = mode.__torch_function__(Tensor.to, (Tensor,), (alias,), to_kwargs)
        if kwargs.get("requires_grad"):
            out.requires_grad_()
        return out

    return from_data
