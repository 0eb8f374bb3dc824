"""The decisions of decode capture, as one frozen object the engine is given.

`Engine(model, config, capture_policy=...)` hands it to `DecoderGraphs`; without one the engine asks
`default_capture_policy()`. A runtime with other rules (or the fault zoo, planting a known bug)
passes a subclass that overrides one method; nothing else in the flow changes.

- `agreement` (`RankAgreement`, agreement.py): every question the ranks answer together.
- `single_pass_allowed_in(phase)`: the KV-cache estimation phase always captures with two passes
  (its graphs are released anyway, and its captures size the final cache).
- `capture_scope(scopes)`: the scope each capture runs under, from the caller's scope factory:
  "serving" (the communication timeouts the graph keeps); warmup forwards run under "warmup".
- `recaptures_for_final_cache()`: the estimation phase releases its graphs and the final phase
  captures again against the reallocated KV cache and metadata.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

from harness.runtime.decode.agreement import RankAgreement

ESTIMATE = "estimate"  # phase 1: KV-cache estimation
SERVE = "serve"  # phase 2: the final KV cache, the graphs that serve
PHASES = (ESTIMATE, SERVE)
WARMUP_SCOPE = "warmup"
SERVING_SCOPE = "serving"

ScopeFactory = Callable[[str], ContextManager[Any]]


def no_scope(name: str) -> ContextManager[Any]:
    """The scope factory of a runtime without scopes."""
    return contextlib.nullcontext()


@dataclass(frozen=True)
class CapturePolicy:
    """How decode graphs are captured; see the module docstring for each decision."""

    agreement: RankAgreement = RankAgreement()

    def single_pass_allowed_in(self, phase: str) -> bool:
        return phase != ESTIMATE

    def capture_scope(self, scopes: ScopeFactory) -> ContextManager[Any]:
        return scopes(SERVING_SCOPE)

    def recaptures_for_final_cache(self) -> bool:
        return True


def default_capture_policy() -> CapturePolicy:
    """The policy of an engine built without one."""
    return CapturePolicy()
