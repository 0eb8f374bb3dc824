"""The fault zoo (docs/design.md, "Faults"): each entry plants one real class of capture bug into the
reference runtime and names the test expected to catch it.

    with inject("metadata-rebound") as handle:
        ...                      # the runtime now has the bug
    handle.fired                 # how many times the planted code ran

Faults by family: ops.py (attention ops and metadata), model.py (weights, scratch), runtime.py
(what the runtime hands out of its graphs), decoder.py (decode graphs, their phases and rank
agreement, planted through the engine's capture policy), piecewise.py (piecewise prefill graphs,
planted through the piecewise policy), overlap.py (the overlap loop's staging, events and stream
order), asynchrony.py (streams, non_blocking copies and captured collectives, planted in
runtime.async_io), compiled.py (the compiled path: inductor pieces, their compiles and outputs). `harness faults` (run.py) proves each one is caught.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from harness.faults.asynchrony import ASYNC_FAULTS
from harness.faults.compiled import COMPILED_FAULTS
from harness.faults.decoder import DECODER_FAULTS
from harness.faults.model import MODEL_FAULTS
from harness.faults.ops import OPS_FAULTS
from harness.faults.overlap import OVERLAP_FAULTS
from harness.faults.piecewise import PIECEWISE_FAULTS
from harness.faults.registry import Fault, FaultHandle, NotPlantableError, get_fault, inject_fault, registry
from harness.faults.runtime import RUNTIME_FAULTS

FAULTS = registry(OPS_FAULTS, MODEL_FAULTS, RUNTIME_FAULTS, DECODER_FAULTS, PIECEWISE_FAULTS,
                  OVERLAP_FAULTS, ASYNC_FAULTS, COMPILED_FAULTS)

# Set by `--plant-fault` for the processes a planted session spawns (torch.distributed ranks start
# fresh interpreters, so the parent's planting does not reach them).
PLANTED_FAULT_VARIABLE = "HARNESS_PLANTED_FAULT"
FIRINGS_FILE_VARIABLE = "HARNESS_FAULT_FIRINGS"


@contextlib.contextmanager
def inject(name: str, backend: str = "emulated") -> Iterator[FaultHandle]:
    """Plant the fault `name` for the duration; yields its handle (`.fired`). Raises KeyError for
    an unknown name and NotPlantableError where this build cannot plant it for `backend`."""
    with inject_fault(get_fault(FAULTS, name), backend) as handle:
        yield handle


@contextlib.contextmanager
def inherited_fault(backend: str = "emulated") -> Iterator[FaultHandle | None]:
    """In a process spawned by a planted session (a rank worker): plant the session's fault for the
    duration and add its firings to the session's count; yields None where no fault is planted."""
    name = os.environ.get(PLANTED_FAULT_VARIABLE)
    if not name:
        yield None
        return
    with inject(name, backend) as handle:
        try:
            yield handle
        finally:
            firings = os.environ.get(FIRINGS_FILE_VARIABLE)
            if firings:
                with open(firings, "a") as out:
                    out.write(f"{handle.fired}\n")


def inherited_firings(path: Path) -> int:
    """The firings spawned processes added to `path` (see inherited_fault)."""
    return sum(int(line) for line in path.read_text().split()) if path.is_file() else 0


__all__ = ["FAULTS", "Fault", "FaultHandle", "NotPlantableError", "inherited_fault", "inject"]
