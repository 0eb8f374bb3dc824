"""A whole decode step captured by hand: the graph candidate of reproduction scenarios and of the
fault zoo until the engine's own decode graphs (`EngineConfig.decode_graph_sizes`) are merged.

Decode batches are padded up to the smallest of `sizes` that fits; the first batch of each size is
captured (one graph per size, each in its own pool) and every batch, that one included, is replayed.
Prefill and mixed batches, and decode batches above the largest size, run eagerly. A replay's logits
are copied out of the graph's static output before they are returned, so a `ForwardResult` stays
valid after the next replay overwrites that output.
"""

from __future__ import annotations

from typing import Sequence as Seq

import torch

from harness.graphs.base import CapturedGraph, GraphBackend
from harness.graphs.pointers import TensorRecord, snapshot_tensors
from harness.runtime.config import EngineConfig
from harness.runtime.engine import Engine, ForwardResult
from harness.runtime.scheduler import ScheduledBatch


def step_producer(size: int) -> str:
    return f"step_bs{size}"


def copy_out(static_output: torch.Tensor) -> torch.Tensor:
    """The replay's result as a tensor of its own: the next replay overwrites the static output."""
    return static_output.clone()


class StepCaptureEngine(Engine):
    def __init__(self, model, config: EngineConfig | None = None, backend: GraphBackend | None = None,
                 *, sizes: Seq[int] = (8,)) -> None:
        super().__init__(model, config, backend)
        if backend is None:
            raise ValueError("StepCaptureEngine needs a graph backend (harness.graphs.get_backend)")
        sizes = tuple(sorted(set(sizes)))
        bad = [s for s in sizes if not isinstance(s, int) or isinstance(s, bool)
               or not 1 <= s <= self.config.max_batch_size]
        if not sizes or bad:
            raise ValueError(f"step capture sizes {list(sizes)} must be integers in "
                             f"[1, {self.config.max_batch_size}] (max_batch_size), at least one")
        self.sizes = sizes
        self.graphs: dict[int, CapturedGraph] = {}
        # What each graph baked in, recorded right after its capture: metadata, scratch, weights.
        self.captured_pointers: dict[int, dict[str, TensorRecord]] = {}

    def pointers(self) -> dict[str, TensorRecord]:
        """The tensors a captured step reads by address, as they are now."""
        return {**snapshot_tensors(self.metadata, "metadata"),
                **snapshot_tensors(self.input_ids, "input_ids"),
                **snapshot_tensors(self.model.workspace, "workspace"),
                **snapshot_tensors(dict(self.model.named_parameters()), "parameters")}

    def _forward(self, batch: ScheduledBatch) -> ForwardResult:
        size = next((s for s in self.sizes if s >= batch.num_seqs), None)
        if batch.kind != "decode" or size is None:
            return super()._forward(batch)
        self._prepare(batch, num_tokens=size, num_seqs=size)
        graph = self.graphs.get(size)
        if graph is None:
            graph = self.backend.capture(
                lambda: self.model(self.input_ids, self.metadata, self.kv_cache))
            self.graphs[size] = graph
            self.captured_pointers[size] = self.pointers()
        graph.replay()
        return ForwardResult(logits=copy_out(graph.output[: batch.num_seqs]),
                             producer=step_producer(size))
