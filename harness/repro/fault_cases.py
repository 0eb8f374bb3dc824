"""The fault zoo's diverging entries as reproductions that `harness explain --fault NAME` explains:
an engine scenario each: the same tiny model and requests, the graph options the fault needs.
Faults whose emulated run raises (a freed buffer, a host sync) are not among them: the error names
the cause already."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from harness.records import Request
from harness.repro.record import ReproRecord
from harness.repro.scenario import Scenario

MODEL_SEED = 0


def _requests() -> tuple[Request, ...]:
    """Eight requests of different lengths, so decode batches shrink through every captured size."""
    rng = random.Random(0)
    lengths = ((3, 8), (7, 16), (12, 9), (19, 12), (26, 10), (33, 16), (40, 11), (5, 13))
    return tuple(Request(prompt=[rng.randrange(512) for _ in range(n)], max_new_tokens=m, logprobs=4)
                 for n, m in lengths)


def _engine(**graph_options: Any) -> dict[str, Any]:
    from harness.runtime import EngineConfig

    base = EngineConfig(max_batch_size=8, max_num_tokens=256, block_size=16, max_model_len=128)
    return replace(base, **graph_options).to_dict()


def _scenario(**graph_options: Any) -> Scenario:
    return Scenario(backend="emulated", model_seed=MODEL_SEED, engine=_engine(**graph_options),
                    requests=_requests(), tolerance_steps=0)


DECODE = {"decode_graph_sizes": (8, 4, 2, 1)}

# fault -> the graph options of its scenario
SCENARIO_OPTIONS: dict[str, dict[str, Any]] = {
    "attention-returns-new-tensor": DECODE,
    "metadata-rebound": DECODE,
    "max-seq-len-baked": DECODE,
    "padding-dummy-aliases-live-blocks": DECODE,
    "graph-key-ignores-sampling-variant": {"decode_graph_sizes": (8,), "graph_top_k": (2, 4)},
    "piecewise-inputs-not-copied": {"decode_graph_sizes": (8,), "piecewise_buckets": (64, 256)},
}


DIVERGING = tuple(sorted(SCENARIO_OPTIONS))


def fault_record(name: str) -> ReproRecord:
    """The reproduction file of a diverging fault that has a scenario."""
    import torch

    if name not in SCENARIO_OPTIONS:
        raise KeyError(f"no scenario reproduction for fault {name!r}; those with one: "
                       f"{', '.join(sorted(SCENARIO_OPTIONS))}")
    return ReproRecord(node_id=f"harness-explain::{name}", backend="emulated", torch=torch.__version__,
                       fault=name, scenario=_scenario(**SCENARIO_OPTIONS[name]),
                       failure=f"fault {name} planted: the candidate diverges from eager")
