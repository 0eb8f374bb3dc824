"""An engine-level comparison as data: build the model, run eager and a graph candidate on the same
requests, compare. What a reproduction file carries so that `harness repro` needs nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from harness.records import Request


@dataclass(frozen=True)
class Scenario:
    """- `backend`: "emulated" or "cuda" (the device follows: cpu for emulated, cuda for cuda).
    - `model_seed`, `model_overrides`: `harness.model.tiny_llama(seed, **overrides)`.
    - `engine`: `EngineConfig.to_dict()`; its graph options (decode_graph_sizes, piecewise_buckets,
      single_pass_capture) configure the candidate and are dropped for the eager baseline.
    - `step_capture_sizes`: when set, the candidate is `StepCaptureEngine(sizes=...)`, a hand-captured
      decode step; when empty, the candidate is `Engine(config, backend)` with its own graph options.
    - `tolerance_steps`: BF16 steps for `compare_generations` (0: exact).
    """

    backend: str
    model_seed: int
    engine: Mapping[str, Any]
    requests: Sequence[Request]
    model_overrides: Mapping[str, Any] = field(default_factory=dict)
    step_capture_sizes: tuple[int, ...] = ()
    tolerance_steps: int = 2

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "model_seed": self.model_seed, "engine": dict(self.engine),
                "requests": [r.to_dict() for r in self.requests],
                "model_overrides": dict(self.model_overrides),
                "step_capture_sizes": list(self.step_capture_sizes),
                "tolerance_steps": self.tolerance_steps}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scenario:
        known = {"backend", "model_seed", "engine", "requests", "model_overrides",
                 "step_capture_sizes", "tolerance_steps"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown scenario fields {unknown}; known are {sorted(known)}")
        return cls(backend=str(data["backend"]), model_seed=int(data["model_seed"]),
                   engine=dict(data["engine"]),
                   requests=tuple(Request.from_dict(r) for r in data["requests"]),
                   model_overrides=dict(data.get("model_overrides", {})),
                   step_capture_sizes=tuple(int(s) for s in data.get("step_capture_sizes", ())),
                   tolerance_steps=int(data.get("tolerance_steps", 2)))


@dataclass(frozen=True)
class ScenarioResult:
    ok: bool
    report: str


def run_scenario(scenario: Scenario) -> ScenarioResult:
    """Run eager and the candidate; the verdict and a report: the divergence report with the
    tensors moved since capture, or the error the candidate raised (a CaptureError names its op)."""
    import torch

    from harness.check import compare_generations, describe_moved
    from harness.graphs import get_backend
    from harness.model import ReferenceLlama, tiny_llama
    from harness.runtime import Engine, EngineConfig
    from harness.runtime.step_capture import StepCaptureEngine

    backend = get_backend(scenario.backend)
    device = torch.device(backend.device)
    config = EngineConfig.from_dict(dict(scenario.engine))
    model = ReferenceLlama.from_hf(tiny_llama(scenario.model_seed, **scenario.model_overrides)).to(device)
    requests = list(scenario.requests)
    eager_config = replace(config, decode_graph_sizes=(), piecewise_buckets=(), single_pass_capture=False)
    baseline = Engine(model, eager_config).generate(requests)
    try:
        if scenario.step_capture_sizes:
            candidate = StepCaptureEngine(model, config, backend, sizes=scenario.step_capture_sizes)
        else:
            candidate = Engine(model, config, backend=backend)
        generations = candidate.generate(requests)
    except Exception as error:  # the verdict of the scenario: reported, exit 1
        return ScenarioResult(False, f"candidate raised {type(error).__module__}."
                                     f"{type(error).__name__}: {error}")
    comparison = compare_generations(baseline, generations, steps=scenario.tolerance_steps)
    lines = [str(comparison)]
    for size, captured in getattr(candidate, "captured_pointers", {}).items():
        moved = describe_moved(captured, candidate.pointers())
        if moved:
            lines.append(f"moved since the capture of size {size}:\n{moved}")
    return ScenarioResult(comparison.ok, "\n".join(lines))
