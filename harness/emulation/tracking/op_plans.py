"""What the stream mode needs to know of an aten op that depends on the op alone, found once per
op: its kind, name, written arguments and whether it can make the host wait or be queued.

The mode meets a few hundred ops per decode step, the same few dozen over and over; asking the
schema, the tags and the lru caches each time was a third of its cost (an OpOverload hashes in
Python). `OpPlans` keys its plans by the op object's id and checks identity, so one dict lookup
of an int answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.graphs.emulator import opinfo
from harness.graphs.emulator.accesses import (COPIES, changes_metadata, is_seeded, may_block_host,
                                              written_names)
from harness.graphs.emulator.opinfo import OpKind
from harness.emulation import host_outputs
from harness.emulation.host_outputs import HostOutputs
from harness.emulation.tracking.deferral import can_defer

_TO_COPY = torch.ops.aten._to_copy.default


@dataclass(frozen=True)
class OpPlan:
    func: Any
    name: str
    composite: bool
    kind: OpKind
    written: frozenset[str]
    may_block_host: bool  # `blocks_host` is asked only when this is True
    deferrable: bool  # may wait in a stream's queue: no seed taken, no metadata changed
    is_to_copy: bool
    is_copy: bool  # a copy between memories: whether it blocks the host is read off its arguments
    touches_results: bool  # False for `empty` and kin: their results are memory no one touched yet
    host: HostOutputs | None = None  # outputs CUDA makes in host memory (host_outputs.py)


def plan_of(func: Any) -> OpPlan:
    if opinfo.is_composite(func):  # decomposed by the mode: nothing else is asked of it
        return OpPlan(func=func, name=opinfo.op_name(func), composite=True, kind=OpKind.MIXED,
                      written=frozenset(), may_block_host=False, deferrable=False,
                      is_to_copy=False, is_copy=False, touches_results=True)
    kind = opinfo.op_kind(func)
    host = host_outputs.of_op(func)
    # An op with host outputs cannot wait in a queue: the host computes them before it returns.
    return OpPlan(func=func, name=opinfo.op_name(func), composite=False, kind=kind,
                  written=written_names(func), may_block_host=may_block_host(func),
                  deferrable=(can_defer(kind) and not is_seeded(func) and not changes_metadata(func)
                              and host is None),
                  is_to_copy=func is _TO_COPY, is_copy=func in COPIES,
                  touches_results=opinfo.special_replay(func) != (True, None), host=host)


class OpPlans:
    """The plans of the ops one stream mode has met."""

    def __init__(self) -> None:
        self._plans: dict[int, OpPlan] = {}

    def get(self, func: Any) -> OpPlan:
        plan = self._plans.get(id(func))
        if plan is None or plan.func is not func:
            plan = self._plans[id(func)] = plan_of(func)  # the plan keeps func, so its id stays
        return plan
