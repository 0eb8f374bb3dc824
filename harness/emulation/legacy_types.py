"""torch's legacy tensor types on the emulated device: `torch.cuda.FloatTensor(2)` and the other
`torch.cuda.*Tensor` constructors make device tensors, `isinstance` tells a device tensor from a
host one by them, and `torch.set_default_tensor_type(torch.cuda.FloatTensor)` sends factories
without a device to the device, as on CUDA.

A CPU build's `torch.cuda.FloatTensor` refuses to be called, and every legacy type's isinstance
reads the tensor's C++ dispatch key, the cpu's for a device tensor. Both answers live on torch's C
metaclass (`torch.tensortype`), which Python cannot change, so for the emulation's duration each
name is a class of `LegacyTensorType` spelled as torch spells it (`x.type(T)` and
`torch.set_default_tensor_type("torch.cuda.FloatTensor")` find it by that name). Each keeps
torch's own type for what that answers right: the host type's constructor and checks, and the
parsing of the forms a device type hands on to it.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from harness import torch_internals
from harness.emulation.device_memory import is_device_memory
from harness.emulation.rules import names_cuda

# torch.cuda's dense legacy types (torch/csrc/tensor/python_tensor.cpp); a name this torch lacks
# in torch or torch.cuda is left alone.
NAMES = ("FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "ByteTensor", "CharTensor",
         "ShortTensor", "IntTensor", "LongTensor", "BoolTensor")

# What torch's types answer as attributes (python_tensor.cpp's getters), copied where present.
_ATTRIBUTES = ("dtype", "layout", "is_cuda", "is_xpu", "is_sparse", "is_sparse_csr")

# CUDA's TORCH_WARN_ONCE in python_tensor.cpp's Tensor_new, measured on the H100 (torch 2.11).
DEPRECATION = ("The torch.cuda.*DtypeTensor constructors are no longer recommended. It's best to "
               "use methods such as torch.tensor(data, dtype=*, device='cuda') to create tensors.")


class LegacyTensorType(type):
    """The metaclass of the emulation's legacy types: a tensor is an instance of a `torch.cuda.*`
    type when torch's host type of its dtype takes it and it is device memory, of a `torch.*` type
    when torch's takes it and it is host memory."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls.host_type) and is_device_memory(obj) is cls.is_cuda

    def __call__(cls, *args: Any, **kwargs: Any) -> torch.Tensor:
        return cls.construct(*args, **kwargs)


def _legacy_type(module: str, name: str, native: Any, host: Any,
                 construct: Callable[..., torch.Tensor]) -> LegacyTensorType:
    attributes = {a: getattr(native, a) for a in _ATTRIBUTES if hasattr(native, a)}
    return LegacyTensorType(name, (), {
        **attributes, "__module__": module, "__qualname__": name, "__doc__": native.__doc__,
        "host_type": host, "native": native, "construct": staticmethod(construct)})


def _is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _device_constructor(name: str, dtype: torch.dtype, host: Any,
                        warn: Callable[[], None]) -> Callable[..., torch.Tensor]:
    """`torch.cuda.<name>(...)`: torch's legacy constructor (tensor_new.cpp,
    legacy_tensor_generic_ctor_new) on the device. Its allocations are the placement mode's
    `torch.empty(..., device=)`, and a data argument is parsed by the host type and copied to
    the device, as CUDA builds it on the host and copies it."""

    def construct(*args: Any, **kwargs: Any) -> torch.Tensor:
        warn()
        device = kwargs.pop("device", None)
        if kwargs:
            return host(*args, **kwargs)  # torch's own TypeError for a keyword it does not take
        if device is not None and not names_cuda(device):
            raise RuntimeError(f"legacy constructor expects device type: cuda but device type: "
                               f"{torch.device(device).type} was passed")
        target = "cuda" if device is None else device
        if not args:
            return torch.empty(0, dtype=dtype, device=target)
        first = args[0]
        if (len(args) == 1 and isinstance(first, torch.Size)) or all(map(_is_size, args)):
            return torch.empty(*args, dtype=dtype, device=target)
        if len(args) == 1 and isinstance(first, torch.Tensor):
            return _alias(name, dtype, host, first, device)
        if len(args) == 1 and isinstance(first, (torch.UntypedStorage, torch.TypedStorage)):
            return _on_storage(name, host, first)
        return host(*args).to(target)  # a sequence of data; torch's own errors for the rest

    return construct


def _alias(name: str, dtype: torch.dtype, host: Any, other: torch.Tensor, device: Any):
    """`torch.cuda.FloatTensor(t)`: `t` itself (an alias) when it is a device tensor of the
    type's dtype; CUDA refuses the rest."""
    if device is not None:
        raise RuntimeError("Legacy tensor constructor of the form torch.Tensor(tensor, "
                           "device=device) is not supported.  Use torch.tensor(...) or "
                           "torch.as_tensor(...) instead.")
    if is_device_memory(other) and other.dtype == dtype and other.layout == torch.strided:
        return host(other)  # shares the storage, and with it the device mark and index
    raise TypeError(f"expected {_options(dtype, 'cuda', torch.strided)} (got "
                    f"{_options(other.dtype, str(other.device), other.layout)})")


# c10's names of the dtypes, as TensorOptions prints them in CUDA's TypeError above.
_C10_NAMES = {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
              torch.bfloat16: "c10::BFloat16", torch.uint8: "unsigned char",
              torch.int8: "signed char", torch.int16: "short int", torch.int32: "int",
              torch.int64: "long int", torch.bool: "bool"}


def _options(dtype: torch.dtype, device: str, layout: torch.layout) -> str:
    layout_name = "Strided" if layout == torch.strided else str(layout).removeprefix("torch.")
    return (f"TensorOptions(dtype={_C10_NAMES.get(dtype, str(dtype))}, device={device}, "
            f"layout={layout_name}, requires_grad=false (default), pinned_memory=false (default), "
            f"memory_format=(nullopt))")


def _on_storage(name: str, host: Any, storage: Any):
    untyped = storage if isinstance(storage, torch.UntypedStorage) else storage.untyped()
    if not is_device_memory(untyped):
        raise RuntimeError(f"Attempted to set the storage of a tensor on device "
                           f"\"cuda:{torch.cuda.current_device()}\" to a storage on different "
                           f"device \"cpu\".  This is no longer allowed; the devices must match.")
    return host(storage)  # the host type's own dtype check; the tensor is on the device storage


def _warn_once() -> Callable[[], None]:
    """CUDA warns once a process; the emulated device, once an emulation."""
    warned: list[bool] = []

    def warn() -> None:
        if not warned:
            warned.append(True)
            import warnings

            warnings.warn(DEPRECATION, UserWarning, stacklevel=4)

    return warn


def legacy_types() -> dict[str, tuple[Any, Any]]:
    """name -> (torch.cuda's type, torch's host type) for each name of NAMES this torch has."""
    cuda, host = vars(torch.cuda), vars(torch)
    return {name: (cuda[name], host[name]) for name in NAMES if name in cuda and name in host}


def default_tensor_type_setter(state, replaced: dict[Any, LegacyTensorType]) -> Callable:
    """`torch.set_default_tensor_type`: a device type sets torch's host type of the same dtype
    (the default dtype, torch's deprecation warning and its refusal of a non-float type) and
    sends factories without a device to the device (placement.py); a host type brings them back."""
    base = torch.set_default_tensor_type

    def set_default_tensor_type(t: Any, /) -> None:
        chosen = torch_internals.torch_namespace(t) if isinstance(t, str) and t.startswith(
            "torch.") else t
        chosen = replaced.get(chosen, chosen)  # a type bound before the emulation began
        if not isinstance(chosen, LegacyTensorType):
            base(t)
            state.legacy_default_on_device = False
            return
        base(chosen.host_type)
        state.legacy_default_on_device = chosen.is_cuda

    return set_default_tensor_type


def patches(state) -> list[tuple[Any, str, Any]]:
    warn = _warn_once()
    out: list[tuple[Any, str, Any]] = []
    replaced: dict[Any, LegacyTensorType] = {}
    for name, (native_cuda, host) in legacy_types().items():
        device_type = _legacy_type("torch.cuda", name, native_cuda, host,
                                   _device_constructor(name, host.dtype, host, warn))
        host_type = _legacy_type("torch", name, host, host, host)
        replaced.update({native_cuda: device_type, host: host_type})
        out += [(torch.cuda, name, device_type), (torch, name, host_type)]
    out.append((torch, "set_default_tensor_type", default_tensor_type_setter(state, replaced)))
    return out


__all__ = ["DEPRECATION", "LegacyTensorType", "NAMES", "legacy_types", "patches"]
