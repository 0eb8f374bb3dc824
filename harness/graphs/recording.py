"""Which graph recordings see only the work that goes through torch's dispatcher.

The emulated backend (and any graph under the emulated CUDA device, `harness.emulate_cuda()`)
records aten ops at the dispatcher. Code that computes without it, such as the C++ kernels
inductor compiles for a CPU, would run once at capture and be missing from every replay, so such
code must reach the recording as one opaque op (runtime/compiled/piece_op.py). A real CUDA graph
records the kernels themselves and needs nothing of the sort.
"""

from __future__ import annotations

from harness.graphs.base import GraphBackend


def records_dispatched_ops_only(backend: GraphBackend | None) -> bool:
    """True when `backend` records at the dispatcher: the emulated backend, or any backend while
    the emulated CUDA device is active. None (no graphs) records nothing: False."""
    if backend is None:
        return False
    if backend.name == "emulated":
        return True
    from harness.emulation import emulation_active

    return emulation_active() is not None
