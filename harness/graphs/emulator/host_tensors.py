"""Host tensors made during an emulated capture on a cpu device.

On CUDA, code that builds a tensor without a device during capture (`torch.arange(n)`, a
`torch.tensor(data)`) builds it on the host, and whatever it computes from host tensors alone runs
on the host too, once, when capture meets it. Moving such a tensor to the device (`.to(x.device)`)
or handing it (more than a 0-dim value) to an op with device tensors is a copy from pageable host
memory, or a mix of devices: capture refuses both. On a cpu device host and device are the same
memory, so the emulator tells them apart by how a tensor was made: a factory without a device (and
no default device set) makes a host tensor, and results of host tensors alone are host tensors.
Any device argument, `x.device` or the string "cpu", names the device: on the emulator's cpu device
"cpu" is what code adapted from CUDA writes for "cuda".

A factory given Python or numpy data and a device is refused at once: on CUDA that is the pageable
copy itself (transformers 5.17's eager mask, `torch.tensor(0.0, device=mask.device)`).
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode

from harness.torch_internals import DeviceContext, get_current_function_mode_stack, tree_flatten
from harness.graphs.base import CaptureError
from harness.graphs.emulator import cuda_errors
from harness.graphs.emulator.callsite import at_callsite, current_callsite

HOST_COPY_REFUSED = ("a copy from pageable host memory; build it before capture and copy new values "
                     "into it, or pin the host data")

_FROM_HOST_DATA = (torch.tensor, torch.as_tensor, torch.asarray)
_FACTORIES = frozenset({
    *_FROM_HOST_DATA, torch.from_numpy, torch.arange, torch.range, torch.zeros, torch.ones,
    torch.empty, torch.full, torch.empty_strided, torch.scalar_tensor, torch.rand, torch.randn,
    torch.randint, torch.randperm, torch.linspace, torch.logspace, torch.eye,
})
_TO = (torch.Tensor.to,)


def _name(func) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", str(func))


def _target_device(args: tuple, kwargs: dict):
    """The device a `Tensor.to` call names, as given (None when it names a dtype or a tensor)."""
    if kwargs.get("device") is not None:
        return kwargs["device"]
    for arg in args[1:]:
        if isinstance(arg, (torch.device, str, int)) and not isinstance(arg, bool):
            return arg
    return None


class HostTensors(TorchFunctionMode):
    """Active during an emulated capture on a cpu device: see the module docstring. With `report`,
    a refusal is handed to `report(op, message)` and the call runs on (the capture lint)."""

    def __init__(self, report: Callable[[str, str], None] | None = None) -> None:
        super().__init__()
        self._host: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self._report = report

    def is_host(self, t: torch.Tensor) -> bool:
        return self._host.get(id(t)) is t

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FROM_HOST_DATA and args and not isinstance(args[0], torch.Tensor) \
                and kwargs.get("device") is not None:
            self._refuse(f"torch.{func.__name__}(..., device={kwargs['device']}) builds a device "
                         f"tensor from host data during capture, {HOST_COPY_REFUSED}",
                         "aten.lift_fresh.default", cuda_errors.PAGEABLE_COPY)
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        host = [t for t in tensors if self.is_host(t)]
        if host and func in _TO:
            target = _target_device(args, kwargs)
            if target is None and len(host) < len(tensors):
                target = next(t.device for t in tensors if not self.is_host(t))
            if target is not None:
                self._refuse(f"Tensor.to moves a host tensor of shape {tuple(args[0].shape)}, built "
                             f"during capture without a device, to {target}: "
                             f"{HOST_COPY_REFUSED}", "aten._to_copy.default",
                             cuda_errors.PAGEABLE_COPY)
        elif host and len(host) < len(tensors) and any(t.dim() > 0 for t in host):
            shape = next(tuple(t.shape) for t in host if t.dim() > 0)
            devices = sorted({str(t.device) for t in tensors if not self.is_host(t)})
            self._refuse(f"{_name(func)} gets a host tensor of shape {shape}, built during capture "
                         f"without a device, with device tensors; a copy of it to the device "
                         f"would be {HOST_COPY_REFUSED}", _name(func),
                         f"Expected all tensors to be on the same device, but found at least two "
                         f"devices, {devices[0] if devices[0] != 'cpu' else 'cuda:0'} and cpu!")
        result = func(*args, **kwargs)
        if self._makes_host_tensors(func, kwargs, tensors, host):
            for out in tree_flatten(result)[0]:
                if isinstance(out, torch.Tensor):
                    self._host[id(out)] = out
        return result

    def _makes_host_tensors(self, func, kwargs: dict, tensors: list, host: list) -> bool:
        if func in _FACTORIES:
            # A device context below this mode adds the device only after this mode has run.
            return kwargs.get("device") is None and \
                not any(isinstance(m, DeviceContext) for m in get_current_function_mode_stack())
        return bool(tensors) and len(host) == len(tensors)

    def _refuse(self, message: str, op: str, cuda_text: str) -> None:
        if self._report is not None:
            self._report(op, message)
            return
        raise CaptureError(cuda_errors.cuda_first(cuda_text, at_callsite(message, current_callsite())),
                           op=op)
