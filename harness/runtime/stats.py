"""What the engine did: eager steps, graph captures and replays per key, fallbacks and their reasons,
and the compiles the compiled path made for batches no graph serves.

`StatsRecorder` is the engine's mutable counter; `engine.stats` hands out an `EngineStats` snapshot
(frozen, plain values), so a test holding one sees exactly the moment it asked.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from harness.records import EAGER


@dataclass(frozen=True)
class BatchRecord:
    """One engine step: its kind ("prefill", "decode" or "mixed"), real sequences and token rows,
    who produced it ("eager" or a graph key), and the KV blocks free once its finished requests
    released theirs."""

    kind: str
    num_seqs: int
    num_tokens: int
    producer: str
    free_blocks: int


@dataclass(frozen=True)
class EngineStats:
    captures: Mapping[str, int] = field(default_factory=dict)
    replays: Mapping[str, int] = field(default_factory=dict)
    capture_passes: Mapping[str, int] = field(default_factory=dict)
    fallbacks: Mapping[str, int] = field(default_factory=dict)
    batches: tuple[BatchRecord, ...] = ()
    # Per reason, compiles of the compiled step for a decode batch no graph serves (a size above
    # every graph, a variant no graph ranks, an engine without decode graphs). Not fallbacks: the
    # batch's own fallback, if it is one, is counted in `fallbacks` by its route; the compile is the
    # compiled path serving an eager size as designed, kept apart so a user sees what it cost.
    eager_compiles: Mapping[str, int] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.batches)

    @property
    def eager_steps(self) -> int:
        return sum(b.producer == EAGER for b in self.batches)

    @property
    def graph_steps(self) -> int:
        return self.steps - self.eager_steps

    def decode_batch_sizes(self) -> list[int]:
        return [b.num_seqs for b in self.batches if b.kind == "decode"]


class StatsRecorder:
    """Counters the engine and its graph managers bump; `snapshot()` freezes them."""

    def __init__(self) -> None:
        self.captures: Counter[str] = Counter()
        self.replays: Counter[str] = Counter()
        self.capture_passes: Counter[str] = Counter()  # per phase, e.g. "estimate", "serve"
        self.fallbacks: Counter[str] = Counter()  # per reason, e.g. "no decode graph for batch 9"
        self.batches: list[BatchRecord] = []
        self.eager_compiles: Counter[str] = Counter()  # e.g. "compiled step: decode batch of 9 (eager)"

    def record_batch(self, record: BatchRecord) -> None:
        self.batches.append(record)

    def snapshot(self) -> EngineStats:
        def frozen(counter: Counter[str]) -> Mapping[str, int]:
            return MappingProxyType(dict(counter))

        return EngineStats(
            captures=frozen(self.captures),
            replays=frozen(self.replays),
            capture_passes=frozen(self.capture_passes),
            fallbacks=frozen(self.fallbacks),
            batches=tuple(self.batches),
            eager_compiles=frozen(self.eager_compiles),
        )
