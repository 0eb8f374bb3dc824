"""torch.cuda's tooling calls on the emulated device, which code written for a GPU makes in passing:
NVTX ranges (a stack kept so that push and pop answer with CUDA's depths; nothing records them),
the synchronization debug mode (`torch.cuda.set_sync_debug_mode("warn"|"error")`: a host read of a
device tensor warns or raises with CUDA's text), the per-process memory fraction (it lowers the
capacity that factories are checked against) and peer access between emulated devices.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

SYNC_DEBUG_MODES = (0, 1, 2)  # default, warn, error: torch.cuda's numbering
SYNC_MESSAGE = "called a synchronizing CUDA operation"


NO_PUSH_POP_TRACKING = -2
NO_RANGE_ID = 0  # what nvtxRangeStartA answers with no tool attached


class NvtxRanges:
    """What `torch.cuda.nvtx` calls (`torch._C._nvtx`'s names) on the emulated device."""

    def __init__(self) -> None:
        self._handles = itertools.count(1)

    # NVTX without a tool attached (no profiler, as on a CI runner) tracks no ranges: a push and
    # a pop answer NVTX_NO_PUSH_POP_TRACKING, -2 (measured on an H100, torch 2.11).
    def rangePushA(self, message: str) -> int:  # noqa: N802 (torch._C._nvtx's names)
        return NO_PUSH_POP_TRACKING

    def rangePop(self) -> int:  # noqa: N802
        return NO_PUSH_POP_TRACKING

    # Nor does it hand out range ids: a start answers 0 every time (measured on an H200, torch
    # 2.11), and ending range 0 is a no-op.
    def rangeStartA(self, message: str) -> int:  # noqa: N802
        return NO_RANGE_ID

    def rangeEnd(self, handle: int) -> None:  # noqa: N802
        pass

    def markA(self, message: str) -> None:  # noqa: N802
        pass

    def deviceRangeStart(self, message: str, stream: Any = None) -> int:  # noqa: N802
        return next(self._handles)

    def deviceRangeEnd(self, handle: int, stream: Any = None) -> None:  # noqa: N802
        pass


def check_sync_debug_mode(mode: Any) -> int:
    if mode not in SYNC_DEBUG_MODES:
        raise RuntimeError(f"invalid value of debug_mode {mode!r}, expected one of "
                           f"{', '.join(map(str, SYNC_DEBUG_MODES))} (default, warn, error)")
    return int(mode)


def on_host_sync(mode: int) -> None:
    """A host read of a device tensor under the synchronization debug mode `mode`."""
    if mode == 2:
        raise RuntimeError(SYNC_MESSAGE)
    if mode == 1:
        warnings.warn(SYNC_MESSAGE, stacklevel=3)


def check_memory_fraction(fraction: Any) -> float:
    if not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction!r}. Allowed range: 0~1")
    return float(fraction)
