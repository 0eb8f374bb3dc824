"""Host reads that never reach the dispatcher on CPU (`tolist`, `numpy`, printing) would slip past
a TorchDispatchMode; while the emulator captures, these Tensor methods raise instead."""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator

import torch

from harness.graphs.base import CaptureError
from harness.graphs.emulator import cuda_errors
from harness.graphs.emulator.callsite import at_callsite, current_callsite

def _guarded(name: str, original: Callable, on_device: Callable[[torch.Tensor], bool],
             device: torch.device, on_sync_refused: Callable[[CaptureError], CaptureError],
             outside: Callable[[str], bool] | None = None) -> Callable:
    @functools.wraps(original)
    def guard(self: torch.Tensor, *args, **kwargs):
        if on_device(self) and (outside is None or not outside(f"Tensor.{name}()")):
            detail = at_callsite(f"Tensor.{name} reads {device} data on the host during capture "
                                 f"(a sync); move it out of the captured region", current_callsite())
            if name in _COPY_TO_HOST:
                raise cuda_errors.pageable_copy_refused(detail, op=f"Tensor.{name}")
            raise on_sync_refused(cuda_errors.sync_refused(detail, op=f"Tensor.{name}"))
        return original(self, *args, **kwargs)
    return guard


HOST_READS = ("tolist", "numpy", "__repr__", "__format__", "__array__")
# These copy the tensor into fresh pageable host memory first, which Copy.cu refuses; printing
# reads values through ops that sync (masked_select, item).
_COPY_TO_HOST = frozenset({"tolist", "numpy", "__array__"})


@contextlib.contextmanager
def wrapped_host_reads(wrap: Callable[[str, Callable], Callable]) -> Iterator[None]:
    """Replace each host-read method `name` of Tensor by `wrap(name, original)` for the duration."""
    saved = {name: torch.Tensor.__dict__.get(name) for name in HOST_READS}
    try:
        for name in HOST_READS:
            setattr(torch.Tensor, name, wrap(name, getattr(torch.Tensor, name)))
        yield
    finally:
        for name, original in saved.items():
            if original is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)


def host_reads_raise(device: torch.device, on_device: Callable[[torch.Tensor], bool] | None = None,
                     on_sync_refused: Callable[[CaptureError], CaptureError] | None = None,
                     outside: Callable[[str], bool] | None = None
                     ) -> contextlib.AbstractContextManager[None]:
    """Make host reads of `device` tensors (those `on_device` answers True for; by default, those
    whose `.device` has `device`'s type) raise `CaptureError` for the duration; a refused sync
    passes through `on_sync_refused` (which returns the error to raise) first. The methods are
    patched for every thread: `outside(call)`, where given, says a read is not the capture's own
    (another thread's, or one on a stream outside the capture), which then runs, or raises what
    `outside` raises."""
    if on_device is None:
        on_device = lambda t: t.device.type == device.type  # noqa: E731
    passed = on_sync_refused if on_sync_refused is not None else (lambda error: error)
    return wrapped_host_reads(
        lambda name, original: _guarded(name, original, on_device, device, passed, outside))
