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
      single_pass_capture, graph_top_k) configure the candidate, `Engine(config, backend)`, and
      are dropped for the eager baseline.
    - `tolerance_steps`: BF16 steps for `compare_generations` (0: exact).
    """

    backend: str
    model_seed: int
    engine: Mapping[str, Any]
    requests: Sequence[Request]
    model_overrides: Mapping[str, Any] = field(default_factory=dict)
    tolerance_steps: int = 2

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "model_seed": self.model_seed, "engine": dict(self.engine),
                "requests": [r.to_dict() for r in self.requests],
                "model_overrides": dict(self.model_overrides),
                "tolerance_steps": self.tolerance_steps}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scenario:
        known = {"backend", "model_seed", "engine", "requests", "model_overrides", "tolerance_steps"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown scenario fields {unknown}; known are {sorted(known)}")
        return cls(backend=str(data["backend"]), model_seed=int(data["model_seed"]),
                   engine=dict(data["engine"]),
                   requests=tuple(Request.from_dict(r) for r in data["requests"]),
                   model_overrides=dict(data.get("model_overrides", {})),
                   tolerance_steps=int(data.get("tolerance_steps", 2)))


@dataclass(frozen=True)
class ReplayResult:
    """The verdict of a replayed reproduction (a scenario, or a test re-run alone) and its report."""

    ok: bool
    report: str


def run_scenario(scenario: Scenario, *, defaults: Mapping[str, Any] = {}) -> ReplayResult:
    """Run eager and the candidate; the verdict and a report: the divergence report with the
    tensors moved since capture, or the error the candidate raised (a CaptureError names its op).
    `defaults` fill the engine fields the scenario leaves unset (`fill_unset`)."""
    import torch

    from harness.check import compare_generations, describe_moved
    from harness.graphs import get_backend
    from harness.model import ReferenceLlama, tiny_llama
    from harness.runtime import Engine, EngineConfig
    from harness.runtime.config import fill_unset
    from harness.graphs.pointers import rebound_tensors, snapshot_tensors, tensor_refs

    backend = get_backend(scenario.backend)
    device = torch.device(backend.device)
    config = fill_unset(EngineConfig.from_dict(dict(scenario.engine)), defaults)
    model = ReferenceLlama.from_hf(tiny_llama(scenario.model_seed, **scenario.model_overrides)).to(device)
    requests = list(scenario.requests)
    eager_config = replace(config, decode_graph_sizes=(), piecewise_buckets=(), single_pass_capture=False,
                           graph_top_k=())
    baseline = Engine(model, eager_config).generate(requests)

    def roots(engine) -> dict:
        runner = engine.decode_graphs.runner if engine.decode_graphs is not None else None
        return {**(runner.roots() if runner is not None else {}),
                "parameters": dict(model.named_parameters())}

    def pointers(engine) -> dict:
        return {k: v for name, root in roots(engine).items() for k, v in snapshot_tensors(root, name).items()}

    def tensors(engine) -> dict:
        return {k: v for name, root in roots(engine).items() for k, v in tensor_refs(root, name).items()}

    def after_capture(lines: list[str]) -> list[str]:
        # A rebound tensor may land at its freed predecessor's address: name it either way.
        rebound = rebound_tensors(objects, tensors(candidate))
        now = pointers(candidate)
        moved = describe_moved({p: r for p, r in captured.items() if p not in rebound}, now)
        return lines + ([f"moved since capture:\n{moved}"] if moved else []) + \
            ([f"rebound since capture: {', '.join(rebound)}"] if rebound else [])

    captured = None
    try:
        candidate = Engine(model, config, backend=backend)
        candidate.prepare_graphs()
        captured, objects = pointers(candidate), tensors(candidate)
        generations = candidate.generate(requests)
    except Exception as error:  # the verdict of the scenario: reported, exit 1
        lines = [f"candidate raised {type(error).__module__}.{type(error).__name__}: {error}"]
        return ReplayResult(False, "\n".join(after_capture(lines) if captured is not None else lines))
    comparison = compare_generations(baseline, generations, steps=scenario.tolerance_steps)
    return ReplayResult(comparison.ok, "\n".join(after_capture([str(comparison)])))
