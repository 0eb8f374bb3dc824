"""`torch.Stream` and `torch.Event`, the device-generic classes, on the emulated device.

On CUDA, `torch.Stream("cuda")` and `torch.Event("cuda")` make CUDA streams and events (and
`torch.cuda.Stream` is a `torch.Stream`). On a build or machine without CUDA they raise, so inside
the emulation both names are classes whose construction for cuda (or for no device: the current
accelerator is cuda there) makes the emulated device's stream or event (cuda_streams.py), and for
any other device torch's own object. `isinstance(x, torch.Stream)` holds for both kinds, as
`isinstance(torch.cuda.Stream(), torch.Stream)` does on CUDA. A stream made so is torch's generic
type, as on CUDA (below), not a `torch.cuda.Stream`: it equals `torch.accelerator.current_stream()`
while current, and a `torch.Stream` rebuilt from its ids (PyTorch's test_accelerator.py asks both);
until 2026-12-07 it was the device's `torch.cuda.Stream`, which compares equal to no generic
stream.

`torch.accelerator.current_stream()` is a `torch.Stream` on CUDA, not a `torch.cuda.Stream`: it
compares unequal to `torch.cuda.current_stream()` (torch.cuda.Stream's `__eq__` takes its own type
only) though it names the same stream, and runtimes rebuild a `torch.cuda.Stream` from its ids.
`AcceleratorStream` is that object for an emulated stream: torch's own class, with the device's
stream doing its work.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.emulation.cuda_streams import Event, Stream, as_device_stream
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

        def __new__(cls, device: Any = None, *, priority: int = 0, **ids):
            if ids:  # torch.Stream(stream_id=, device_index=, device_type=): an existing stream
                if ids.get("device_type") == 1:  # c10::DeviceType::CUDA
                    return AcceleratorStream(as_device_stream(_TorchStream(**ids)))
                return _TorchStream(**ids)
            if _on_device(device):
                return AcceleratorStream(Stream(device, priority=priority))
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


class AcceleratorStream(_TorchStream):
    """A `torch.Stream` naming one of the device's streams (see the module docstring)."""

    def __new__(cls, stream: Stream):
        self = _TorchStream.__new__(cls, stream_id=stream.stream_id,
                                    device_index=stream.device_index,
                                    device_type=stream.device_type)
        self.device_stream = stream
        return self

    def query(self) -> bool:
        return self.device_stream.query()

    def synchronize(self) -> None:
        self.device_stream.synchronize()

    def wait_event(self, event) -> None:
        self.device_stream.wait_event(event)

    def wait_stream(self, stream) -> None:
        self.device_stream.wait_stream(as_device_stream(stream))

    def record_event(self, event=None):
        return self.device_stream.record_event(event)

    def is_capturing(self) -> bool:
        return self.device_stream.is_capturing()

    @property
    def native_handle(self) -> int:
        return self.device_stream.cuda_stream

    def __enter__(self) -> "AcceleratorStream":
        self.device_stream.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.device_stream.__exit__(*exc)


def accelerator_current_stream(state, device: Any = None) -> AcceleratorStream:
    """`torch.accelerator.current_stream()`: the current stream, as torch's generic type."""
    return AcceleratorStream(state.streams.current(device))


def dynamo_current_stream(owner: str):
    """A builder of the replacement of `get_current_stream` in dynamo's module `owner`
    ("torch._dynamo.utils", "torch._dynamo.guards"): from torch 2.15 the bytecode dynamo writes
    for a compiled frame, and its guards, ask C++ for the current stream
    (`torch._C._dynamo.utils.get_current_stream`, c10's getCurrentCUDAStream), which a CUDA wheel
    without a GPU answers with "CUDA driver version is insufficient". For cuda it is the emulated
    device's current stream as `torch.accelerator.current_stream()` gives it. Each owner gets a
    function of its own (dynamo's trace rules refuse one function known under two names)."""
    from harness.torch_internals import torch_namespace

    def build(state):
        original = getattr(torch_namespace(owner), "get_current_stream")

        def get_current_stream(device):
            if names_cuda(device):
                return accelerator_current_stream(state, device)
            return original(device)

        return get_current_stream

    return build


def dynamo_builds_event(state):
    """`torch._dynamo.utils.build_event`, which the bytecode dynamo writes for a compiled function
    calls to make an event the function creates (`torch.cuda.Event()` in it): torch's raw
    `torch._C.Event`, an event of the build's accelerator (a CPU event on a CPU wheel, which a
    device stream refuses to record; a real CUDA event on a CUDA wheel, which reaches the
    driver). Here the event is made as `torch.Event` makes it inside the emulation."""

    def build_event(args, kwargs):
        return torch.Event(*args, **kwargs)

    return build_event


def dynamo_builds_stream(state):
    """`torch._dynamo.utils.build_stream`, the same for a stream a compiled function creates."""

    def build_stream(args, kwargs):
        return torch.Stream(*args, **kwargs)

    return build_stream


def accelerator_set_stream(state, stream) -> None:
    """`torch.accelerator.set_stream()`: either kind of stream, made current with its device."""
    stream = as_device_stream(stream)
    state.streams.set_current(stream)
    state.current_index = stream.device_index

