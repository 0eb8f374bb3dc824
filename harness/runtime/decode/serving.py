"""Serving a decode batch from the captured graphs: which graph it replays, why none does (each
reason counted in `engine.stats.fallbacks`), and the replay's output copied out of the graph.

A batch of n sequences wanting `logprobs` top entries each replays the graph of the smallest
captured size >= n and, when the graphs rank on the device, of the smallest k >= its widest request
(at least 1: the token itself). A graph's outputs are static: the next replay overwrites them, so
what a step hands out is a copy (`copy_out`), logits and ranking alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from harness.ops.sizing import smallest_fitting
from harness.ranking import PackedRanking
from harness.runtime.decode.runner import DecodeGraphKey


@dataclass(frozen=True)
class GraphStep:
    """One replay's output for the real sequences: logits (a "greedy" graph) or the packed ranking a
    f"top{k}" graph made on the device; copies the next replay leaves alone unless the caller asked
    for the static output itself (`DecoderGraphs.run(..., copy=False)`)."""

    logits: torch.Tensor | None  # [real sequences, vocab]
    key: DecodeGraphKey
    packed: PackedRanking | None = None


@dataclass(frozen=True)
class GraphChoice:
    """The (size, top_k) a decode batch replays, or the reason no captured graph holds it."""

    size: int | None
    top_k: int | None
    reason: str | None = None


def copy_out(static_output: torch.Tensor) -> torch.Tensor:
    """A replay's output as a tensor of its own: the next replay overwrites the static output, and a
    caller may hold a step's result past it."""
    return static_output.clone()


def copy_packed_out(packed: PackedRanking) -> PackedRanking:
    """A graph's static packed ranking (its real rows), each tensor through `copy_out`."""
    return PackedRanking(values=copy_out(packed.values), tokens=copy_out(packed.tokens))


def choose_graph(keys: Sequence[DecodeGraphKey], top_ks: Sequence[int], num_seqs: int,
                 logprobs: Sequence[int] = ()) -> GraphChoice:
    """The graph size and k for `num_seqs` sequences wanting `logprobs` entries each."""
    width = max(max(logprobs, default=0), 1)
    top_k = smallest_fitting(width, top_ks)
    size = smallest_fitting(num_seqs, (k.batch_size for k in keys))
    if not keys:
        return GraphChoice(size, top_k, f"decode batch of {num_seqs}: no decode graph captured")
    if top_ks and top_k is None:
        return GraphChoice(size, top_k, f"decode batch of {num_seqs} wants top-{width} logprobs, more "
                                        f"than the largest graph_top_k ({max(top_ks)})")
    if size is None:
        largest = max(k.batch_size for k in keys)
        return GraphChoice(size, top_k, f"decode batch of {num_seqs} exceeds the largest decode graph "
                                        f"({largest})")
    return GraphChoice(size, top_k)


def missing_key_reason(num_seqs: int, key: DecodeGraphKey, keys: Sequence[DecodeGraphKey]) -> str:
    return (f"decode batch of {num_seqs}: no decode graph {key} (captured: "
            f"{', '.join(map(str, keys))})")
