"""Keeps pytest's log capture off torch's structured-trace logger in harness sessions.

pytest (9+) attaches its capture handlers to every logger that does not propagate. torch's trace
logger ("torch.__trace") never propagates and is always at DEBUG: torch writes to it only when it
has a handler (TORCH_TRACE sets one). With pytest's handlers on it, every torch.compile emits
structured-trace records, and a failing test's report (and `harness repro`) carried a hundred lines
of `DEBUG torch.__trace`. Taking pytest's handlers off again leaves torch's own logging as torch set
it: its level, its propagation and its own handler (TORCH_TRACE) are untouched.
"""

from __future__ import annotations

import logging

TRACE_LOGGER = "torch.__trace"  # torch._logging's trace_log


def detach_pytest_handlers() -> int:
    """Remove from torch's trace logger the handlers pytest put there (the same objects it put
    on the root logger); how many were removed. Imports nothing: without torch there is none."""
    trace = logging.Logger.manager.loggerDict.get(TRACE_LOGGER)
    if not isinstance(trace, logging.Logger):
        return 0
    shared = [handler for handler in trace.handlers if handler in logging.getLogger().handlers]
    for handler in shared:
        trace.removeHandler(handler)
    return len(shared)
