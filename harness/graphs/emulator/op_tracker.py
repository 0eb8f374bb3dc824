"""Which aten op a failed CUDA capture broke on. torch's error for a sync during capture names no
op (`torch.equal`, `bool(tensor)`); a light dispatch mode, active during capture only, remembers
the innermost op an exception left, so the CaptureError can name it as the emulator does."""

from __future__ import annotations


from harness.torch_internals import TorchDispatchMode
from harness.graphs.emulator.opinfo import op_name


class FailedOpTracker(TorchDispatchMode):
    """`failed` names the op whose call raised last, or is None; an op that runs afterwards clears
    it, so an error the captured code caught and handled is not blamed for a later one."""

    def __init__(self) -> None:
        super().__init__()
        self.failed: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.failed = None
        try:
            return func(*args, **(kwargs or {}))
        except Exception:
            self.failed = op_name(func)
            raise
