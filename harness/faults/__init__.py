"""The fault zoo (DESIGN.md, "Faults"): each entry plants one real class of capture bug into the
reference runtime and names the test expected to catch it.

    with inject("metadata-rebound") as handle:
        ...                      # the runtime now has the bug
    handle.fired                 # how many times the planted code ran

Faults by family: ops.py (attention ops and metadata), model.py (weights, scratch), runtime.py
(graph machinery). `harness faults` (run.py) proves each one is caught.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from harness.faults.model import MODEL_FAULTS
from harness.faults.ops import OPS_FAULTS
from harness.faults.registry import Fault, FaultHandle, NotPlantableError, get_fault, inject_fault, registry
from harness.faults.runtime import RUNTIME_FAULTS

FAULTS = registry(OPS_FAULTS, MODEL_FAULTS, RUNTIME_FAULTS)


@contextlib.contextmanager
def inject(name: str, backend: str = "emulated") -> Iterator[FaultHandle]:
    """Plant the fault `name` for the duration; yields its handle (`.fired`). Raises KeyError for
    an unknown name and NotPlantableError where this build cannot plant it for `backend`."""
    with inject_fault(get_fault(FAULTS, name), backend) as handle:
        yield handle


__all__ = ["FAULTS", "Fault", "FaultHandle", "NotPlantableError", "inject"]
