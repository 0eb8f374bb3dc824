"""`torch.Stream` and `torch.Event`, the device-generic classes, on the emulated device.

On CUDA, `torch.Stream("cuda")` and `torch.Event("cuda")` make CUDA streams and events (and
`torch.cuda.Stream` is a `torch.Stream`). On a build or machine without CUDA they raise, so inside
the emulation both names are classes whose construction for cuda (or for no device: the current
accelerator is cuda there) makes the emulated device's stream or event (cuda_streams.py), and for
any other device torch's own object. `isinstance(x, torch.Stream)` holds for both kinds, as
`isinstance(torch.cuda.Stream(), torch.Stream)` does on CUDA.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.emulation.cuda_streams import Event, Stream
from harness.emulation.rules import names_cuda

_TorchStream = torch.Stream
_TorchEvent = torch.Event


class _EitherStream(type(_TorchStream)):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, (_TorchStream, Stream))

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, (_TorchStream, Stream))


class _EitherEvent(type(_TorchEvent)):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, (_TorchEvent, Event))

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, (_TorchEvent, Event))


def _on_device(device: Any) -> bool:
    return device is None or names_cuda(device)


def stream_class(state) -> type:
    """What `torch.Stream` is inside the emulation."""

    class DeviceStream(_TorchStream, metaclass=_EitherStream):
        __doc__ = _TorchStream.__doc__

        def __new__(cls, device: Any = None, *, priority: int = 0):
            if _on_device(device):
                return Stream(device, priority=priority)
            return _TorchStream(device, priority=priority)

    DeviceStream.__name__ = DeviceStream.__qualname__ = "Stream"
    return DeviceStream


def event_class(state) -> type:
    """What `torch.Event` is inside the emulation."""

    class DeviceEvent(_TorchEvent, metaclass=_EitherEvent):
        __doc__ = _TorchEvent.__doc__

        def __new__(cls, device: Any = None, *, enable_timing: bool = False,
                    blocking: bool = False, interprocess: bool = False):
            if _on_device(device):
                # A bad ordinal raises CUDA's error; None is the current device.
                index = state.streams.device_index(device)
                event = Event(enable_timing=enable_timing, blocking=blocking,
                              interprocess=interprocess)
                event.made_for = torch.device("cuda", index)
                return event
            return _TorchEvent(device, enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)

    DeviceEvent.__name__ = DeviceEvent.__qualname__ = "Event"
    return DeviceEvent
