"""The capture decision: why the warmup-only pass must not be skipped here, if it must not.

The single pass saves the warmup-only pass, which is safe only where that pass does nothing but warm
up. A blocker is one of its other duties (or a state that makes the single pass unsafe), returned as
a reason the engine logs when single_pass_capture was asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class CaptureFeatures:
    """Duties of the warmup-only pass beyond warming up, each a reason not to skip it."""

    lora_graphs: bool = False
    tunes_kernels_in_warmup: bool = False
    pipeline_parallel_size: int = 1


def single_pass_blocker(features: CaptureFeatures, captured: Sequence[object], *,
                        supports_single_pass: bool = True, owner: str = "DecoderGraphs") -> str | None:
    """Why the warmup-only pass must not be skipped, or None. `captured`: the keys already captured;
    `supports_single_pass` False for a graph manager whose shapes rely on the warmup-only pass."""
    if captured:
        return f"decode graphs are already captured ({', '.join(map(str, captured))})"
    if features.lora_graphs:
        return "LoRA graphs are captured, and their kernels are tuned in the warmup-only pass"
    if features.tunes_kernels_in_warmup:
        return "kernels are tuned in the warmup-only pass"
    if not supports_single_pass:
        return f"{owner} sets supports_single_pass_capture = False"
    if features.pipeline_parallel_size > 1:
        return (f"pipeline parallelism ({features.pipeline_parallel_size} stages): a stage "
                f"that skips a shape would miss its peers' line-up")
    return None
