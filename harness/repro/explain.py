"""`harness explain`: the engine-side glue of `harness.check.explain_divergence` for a reproduction
file or a `Scenario`: the scenario's candidate engine is built on the explaining backend (with the
file's fault planted) and its requests run; every graph replay is compared op by op with an eager
run of what the graph captured, and before it the host's decisions that an eager run of the same
callable shares are checked (replay_checks.py: the padding, the graph key, the copy into static
inputs). Tensors are named by their paths in the engine's decode-graph roots
and the model's parameters."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable

from harness.check.explain import Explanation, explain_divergence
from harness.repro.record import ReproRecord, load_record
from harness.repro.replay_checks import HostDecisions
from harness.repro.scenario import Scenario

__harness_machinery__ = True  # its frames are not the program's callers (callsite.py)


def engine_roots(engines: list[Any]) -> Callable[[], dict[str, Any]]:
    """What names a tensor in the report: the latest engine's decode-graph roots and its model."""
    def roots() -> dict[str, Any]:
        if not engines:
            return {}
        engine = engines[-1]
        runner = engine.decode_graphs.runner if engine.decode_graphs is not None else None
        return {**(runner.roots() if runner is not None else {}), "model": engine.model}
    return roots


def explain_engine_step(step: Callable[[Any, list[Any]], Any], requests: list[Any], *,
                        fault: str | None = None, steps: float = 0, context: int = 3,
                        device: Any = None) -> Explanation:
    """Explain `step(backend, engines)`, which builds an engine on `backend` (appending it to
    `engines` as soon as it is built) and returns it, then its `generate(requests)`, with `fault`
    planted for the duration; an error the engine raises is reported in the explanation."""
    engines: list[Any] = []
    planted = contextlib.nullcontext()
    if fault is not None:
        from harness.faults import inject

        planted = inject(fault, "emulated")
    decisions = HostDecisions(engines)
    with planted, decisions.planted():
        return explain_divergence(lambda backend: step(backend, engines), requests=requests, steps=steps,
                                  context=context, roots=engine_roots(engines), checks=(decisions.check,),
                                  device=device)


def explain_scenario(scenario: Scenario, *, fault: str | None = None, context: int = 3) -> Explanation:
    """Explain the first replayed op of `scenario`'s candidate that departs from eager, with `fault`
    planted for the duration. Only the emulated backend can observe a replay op by op."""
    import torch

    from harness.model import ReferenceLlama, tiny_llama
    from harness.runtime import Engine, EngineConfig

    if scenario.backend != "emulated":
        raise ValueError(f"harness explain observes emulated replays; the scenario ran on "
                         f"{scenario.backend!r}: record it with --graph-backend emulated (accepted: 'emulated')")
    from harness.emulation import emulation_active

    config = EngineConfig.from_dict(dict(scenario.engine))
    # Inside emulate_cuda() (`harness explain --emulate-cuda`) the engine runs on the emulated "cuda"
    # device and its graphs are captured through torch.cuda there.
    device = torch.device("cuda" if emulation_active() is not None else "cpu")
    model = ReferenceLlama.from_hf(tiny_llama(scenario.model_seed, **scenario.model_overrides)).to(device)

    def step(backend, engines: list[Any]) -> Any:
        engine = Engine(model, config, backend=backend)
        engines.append(engine)
        engine.prepare_graphs()
        return engine

    return explain_engine_step(step, list(scenario.requests), fault=fault, steps=scenario.tolerance_steps,
                               context=context, device=device)


def explain_record(record: ReproRecord, *, without_fault: bool = False, context: int = 3) -> Explanation:
    if record.scenario is None:
        raise ValueError(f"{record.node_id}: the reproduction file carries no engine scenario to explain; "
                         f"only tests that record one (the repro_scenario fixture) can be explained, "
                         f"re-run it with `harness repro` instead")
    return explain_scenario(record.scenario, fault=None if without_fault else record.fault, context=context)


def explain_file(path: Path, *, without_fault: bool = False, context: int = 3) -> Explanation:
    """`harness explain FILE`: explain the reproduction file at `path`."""
    return explain_record(load_record(Path(path)), without_fault=without_fault, context=context)


def explain_fault(name: str, *, context: int = 3) -> Explanation:
    """`harness explain --fault NAME`: explain a diverging fault zoo entry's own reproduction."""
    from harness.repro.fault_cases import DIVERGING, fault_record

    if name not in DIVERGING:
        raise KeyError(f"fault {name!r} has no reproduction that diverges; those that do: "
                       f"{', '.join(DIVERGING)}")
    return explain_record(fault_record(name), context=context)


# --- `harness explain FILE.py::FUNCTION`: a user's own code ------------------------------------

def load_entry_point(target: str) -> Callable[..., Any]:
    """`FILE.py::FUNCTION` -> the function, its file imported as a module of its own (with its
    folder on `sys.path` meanwhile, so that the file's sibling imports resolve). FUNCTION runs the
    workload once: with `graphed=True` capturing and replaying its torch.cuda graphs, with
    `graphed=False` the same work eagerly."""
    import importlib.util
    import inspect
    import sys

    path, sep, name = target.partition("::")
    if not sep or not name or not path.endswith(".py"):
        raise ValueError(f"{target!r}: expected FILE.py::FUNCTION (a function taking graphed=True|False)")
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{target!r}: no file {file}")
    module_name = f"harness_explain_target_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(spec)
    folder = str(file.resolve().parent)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    function = getattr(module, name, None)
    if not callable(function):
        found = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
        raise ValueError(f"{target!r}: {file} has no function {name!r}; its functions: {', '.join(found) or 'none'}")
    try:
        inspect.signature(function).bind(graphed=True)
    except TypeError as error:
        raise ValueError(f"{target!r}: {name} must take graphed=True|False ({error})") from None
    return function


def explain_entry_point(target: str, *, steps: float = 2, context: int = 3) -> Explanation:
    """`harness explain FILE.py::FUNCTION`: `FUNCTION(graphed=True)` explained against
    `FUNCTION(graphed=False)` (harness.check.explain_cuda.explain_against_eager), inside the active
    `harness.emulate_cuda()` or one of its own (the graph sanitizer on a machine with a GPU)."""
    from harness.check.explain_cuda import explain_against_eager
    from harness.emulation import emulate_cuda, emulation_active

    if emulation_active() is None:
        with emulate_cuda():
            return explain_entry_point(target, steps=steps, context=context)
    function = load_entry_point(target)
    return explain_against_eager(lambda: function(graphed=True), lambda: function(graphed=False),
                                 steps=steps, context=context)
