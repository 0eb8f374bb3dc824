"""CUDA's words for what the emulated device refuses, and how a device argument is read."""

from __future__ import annotations

from typing import Any

import torch

from harness.graphs.base import CaptureError
from harness.graphs.emulator import cuda_errors
from harness.graphs.emulator.callsite import at_callsite, current_callsite

CPU = torch.device("cpu")

PAGEABLE_COPY_TEXT = cuda_errors.PAGEABLE_COPY


# torch >= 2.9 raises CUDA's runtime errors as torch.AcceleratorError, a RuntimeError.
_ACCELERATOR_ERROR = getattr(torch, "AcceleratorError", RuntimeError)


class DeviceIndexError(_ACCELERATOR_ERROR):
    """A device index the emulated device does not have (CUDA: "invalid device ordinal")."""


class CapturedEventError(_ACCELERATOR_ERROR):
    """An event whose last record was captured into a graph, used outside that capture."""


def captured_event_used(what: str) -> CapturedEventError:
    """CUDA's answer to a query, synchronize or wait on an event last recorded during a capture
    that has ended (not an `external=True` event, which the graph records at each replay)."""
    return CapturedEventError(at_callsite(
        f"CUDA error: invalid argument\n{what} on an event last recorded during a graph capture "
        f"that has ended: the record became part of the graph, and the event was never recorded "
        f"outside it. Record it again after the capture, or make it with "
        f"torch.cuda.Event(external=True) so that each replay records it", current_callsite()))


class EventFlagsError(_ACCELERATOR_ERROR):
    """An event whose flags cudaEventCreateWithFlags refuses, raised where CUDA makes the event."""


def interprocess_timing_event(what: str) -> EventFlagsError:
    """`torch.cuda.Event(enable_timing=True, interprocess=True)`: torch makes the event lazily, at
    its first record (or `ipc_handle()`), with cudaEventInterprocess and without
    cudaEventDisableTiming, which the runtime refuses ("cudaEventInterprocess must be specified
    along with cudaEventDisableTiming"): cudaErrorInvalidValue through C10_CUDA_CHECK."""
    return EventFlagsError(at_callsite(
        f"CUDA error: invalid argument\n{what} of an event made with interprocess=True and "
        f"enable_timing=True: CUDA makes an interprocess event only without timing "
        f"(cudaEventInterprocess needs cudaEventDisableTiming); make it with enable_timing=False",
        current_callsite()))


def cuda_device(index: int) -> torch.device:
    return torch.device("cuda", index)


def names_cuda(device: Any) -> bool:
    """Whether a device argument names cuda: "cuda", "cuda:1", torch.device("cuda"), or an int
    (PyTorch reads a bare index as a cuda device)."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device == "cuda" or device.startswith("cuda:")
    return isinstance(device, int) and not isinstance(device, bool)


def cuda_index(device: Any, current: int, count: int) -> int:
    """The cuda device index a device argument names (None index: the current device); an index the
    emulated device lacks raises CUDA's error."""
    if isinstance(device, int):
        index = device
    elif not isinstance(device, (str, torch.device)) and isinstance(getattr(device, "idx", None),
                                                                     int):
        # a torch.cuda.device context, as torch.cuda's _get_device_index reads it
        index = device.idx
    else:
        index = torch.device(device).index
        index = current if index is None else index
    if not 0 <= index < count:
        raise DeviceIndexError(f"CUDA error: invalid device ordinal (device index {index}; the "
                               f"emulated device has {count} device(s), indices 0 to {count - 1})")
    return index


def device_index(device: Any, current: int, count: int) -> int:
    """The index a torch.cuda call's device argument names: `current` for None, a name read as a
    device (as torch.cuda's _get_device_index reads one); another device type is refused."""
    if device is None:
        return current
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device) and device.type != "cuda":
        raise ValueError(f"Expected a cuda device, but got: {device}")
    return cuda_index(device, current, count)


NEW_GENERATOR_IN_CAPTURE = ("Cannot construct a new CUDAGeneratorImpl during CUDA graph capture. If "
                            "you need this call to be captured, please file an issue. Current "
                            "cudaStreamCaptureStatus: cudaStreamCaptureStatusActive")


def generator_made_in_capture(index: int) -> CaptureError:
    """CUDAGeneratorImpl's constructor refuses to run while the current stream captures."""
    return CaptureError(at_callsite(
        f"{NEW_GENERATOR_IN_CAPTURE}\ntorch.Generator(device='cuda:{index}') was made while the "
        f"current stream captures a graph. Make the generator before capture and register it with "
        f"graph.register_generator_state(generator)", current_callsite()), op="torch.Generator")


def mixed_devices_error(first: str, second: str) -> RuntimeError:
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                        f"devices, {first} and {second}!")


def events_of_two_devices_error(start: int, end: int) -> RuntimeError:
    """cudaEventElapsedTime of events recorded on two devices: CUDA times events of one device
    only (torch's CUDAEvent::elapsed_time passes the error on)."""
    return RuntimeError(f"CUDA error: invalid resource handle (Event.elapsed_time() between an "
                        f"event recorded on cuda:{start} and one recorded on cuda:{end}; CUDA "
                        f"times two events of one device only: record both on one device)")


def event_recorded_on_another_device(event_device: int, stream_device: int,
                                     generic: bool) -> RuntimeError:
    """A recorded event recorded again on a stream of another device. CUDA makes an event on its
    first record's device and checks each later record against it: c10's CUDAEvent::record for
    `torch.cuda.Event`, CUDAGuardImpl::record (through InlineEvent) for `torch.Event`."""
    if generic:
        return RuntimeError(f"Event device index {event_device} does not match recording "
                            f"stream's device index {stream_device}.")
    return RuntimeError(f"Event device {event_device} does not match recording stream's device "
                        f"{stream_device}.")


def reseed_in_capture_error(generator: Any, seed: int) -> CaptureError:
    """CUDAGeneratorImpl::set_current_seed during a capture, to another seed than its own."""
    return CaptureError(cuda_errors.cuda_first(cuda_errors.RESEED, at_callsite(
        f"{generator!r} reseeded with {seed} during capture, but it was seeded with "
        f"{generator.initial_seed()}; CUDA allows only the same seed: seed before capture",
        current_callsite())), op="Generator.manual_seed")


def host_generator_error() -> RuntimeError:
    """CUDA's refusal of a cpu `torch.Generator` for a random op on the device."""
    return RuntimeError("Expected a 'cuda' device type for generator but found 'cpu'")


def device_generator_on_host_error() -> RuntimeError:
    """CUDA's refusal of a cuda `torch.Generator` for a random op on the host."""
    return RuntimeError("Expected a 'cpu' device type for generator but found 'cuda'")


def numpy_of_device_error(index: int) -> TypeError:
    return TypeError(f"can't convert cuda:{index} device type tensor to numpy. Use Tensor.cpu() to "
                     f"copy the tensor to host memory first.")


def pageable_copy_refused(op: str, shape: tuple) -> CaptureError:
    """A copy between pageable host memory and the device during capture (either direction):
    Copy.cu's check, a RuntimeError."""
    return cuda_errors.pageable_copy_refused(at_callsite(
        f"{op} copies a pageable host tensor of shape {shape} to the device during capture. Copy "
        f"into a static device buffer before capture, or copy from a pinned host buffer with "
        f"non_blocking=True, which the graph re-reads at every replay", current_callsite()), op=op)


def host_copy_refused(op: str, shape: tuple) -> CaptureError:
    """A copy of a device tensor into pageable host memory during capture (`.cpu()`, `.tolist()`,
    `host.copy_(x)`): Copy.cu refuses it before it would sync."""
    return cuda_errors.pageable_copy_refused(at_callsite(
        f"{op} copies a device tensor of shape {shape} to pageable host memory during capture; "
        f"read results after replay(), or copy into a pinned buffer with non_blocking=True",
        current_callsite()), op=op)


def blocking_copy_refused(op: str, shape: tuple, direction: str) -> CaptureError:
    """A copy with a pinned host side but without non_blocking during capture: Copy.cu captures
    the cudaMemcpyAsync, then waits for the stream (memcpy_and_sync), which a capturing stream
    refuses (torch.AcceleratorError)."""
    return cuda_errors.sync_refused(at_callsite(
        f"{op} copies a tensor of shape {shape} {direction} a pinned host buffer during capture "
        f"without non_blocking=True, so the host waits for the stream (a sync); pass "
        f"non_blocking=True", current_callsite()), op=op)

