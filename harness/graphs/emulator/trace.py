"""What a recording knows about each op it recorded, for a reader that compares a replay with an
eager run op by op (harness.check.explain): the op, the user frames that issued it, its arguments
as the replay passes them, where each tensor argument's memory came from, and the tensors it writes.

A record holds the replay's non-owning aliases, never the capture-time tensors, so it keeps no
memory alive that the recording itself does not.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

from harness.graphs.emulator.callsite import Frame


class Origin(enum.Enum):
    POOL = "pool"          # graph memory: a block of the capture's pool
    EXTERNAL = "external"  # memory allocated outside the graph, read at its capture-time address
    CONSTANT = "constant"  # host data the recording keeps as a constant
    HOST = "host"          # a Python value (int, float, list, dtype, ...) frozen into the recording


@dataclass(frozen=True)
class Argument:
    name: str
    value: Any  # the replay's tensor (an alias of the captured memory) or the host value
    origin: Origin
    written: bool = False  # the op writes this argument (in place or out=)


@dataclass(frozen=True)
class OpRecord:
    """One recorded op. `step` is the index of the replay call after which `outputs` hold its
    results (rng bookkeeping adds calls without records, so indices are not consecutive)."""

    step: int
    op: str
    frames: tuple[Frame, ...]
    arguments: tuple[Argument, ...]
    outputs: tuple[torch.Tensor, ...]
    external_writes: tuple[torch.Tensor, ...] = ()  # the outputs on memory the graph does not own
