"""EngineConfig: the engine's sizes and switches, frozen so a run can be saved and replayed."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

import torch


@dataclass(frozen=True)
class EngineConfig:
    """How the engine sizes its batches and KV cache.

    - `max_batch_size`, `max_num_tokens`: the largest batch, in sequences and in token rows; the
      attention metadata is preallocated for it.
    - `block_size`, `num_blocks`: the paged KV cache. `num_blocks=None` gives every one of
      `max_batch_size` sequences room for `max_model_len` tokens.
    - `max_model_len`: the longest prompt + completion; None takes the model's position limit.
    - `device`, `dtype`: where and in what the KV cache lives. The engine runs where the model is and
      stores K/V as the model computes them, so these must match the model's; None takes them.

    Graph options:
    - `decode_graph_sizes`: batch sizes to capture decode graphs for (empty: no decode graphs).
    - `piecewise_buckets`: token counts to capture piecewise prefill graphs for (empty: none); the
      engine refuses them for now rather than run eager while a graph run was asked for.
    - `single_pass_capture`: opt in to single-pass decode capture (default two passes). Also set by
      the environment variable HARNESS_SKIP_WARMUP_PASS=1, read when a config is built.
    - `strict_graph_buffers`: check, before every decode-graph replay, that no tensor the graph
      baked in has moved, and raise naming it.
    - `graph_top_k`: the sampling variants of the decode graphs, as how many top logprobs each graph
      ranks on the device (deduplicated and sorted). Empty: graphs output logits and the host ranks
      them (variant "greedy"). Set: one graph per (size, k), variant f"top{k}"; a decode batch
      replays the smallest k >= its largest requested `logprobs` (at least 1), and a batch wanting
      more than every k runs eagerly, counted in `stats.fallbacks`.

    Step loop:
    - `overlap`: TensorRT-LLM's overlap scheduler (overlap.py). Tokens are sampled on the device and
      come back through pinned host memory behind an event; step n + 1 is scheduled, staged and
      launched before the host reads step n's tokens, which it feeds to step n + 1 on the device.
      The host learns that a request finished one step late: the extra token computed for it is
      dropped, so the generations are those of the loop without overlap. Each request reserves KV
      room for that extra token.
    """

    max_batch_size: int = 8
    max_num_tokens: int = 512
    block_size: int = 16
    num_blocks: int | None = None
    max_model_len: int | None = None
    device: str | None = None
    dtype: torch.dtype | None = None
    decode_graph_sizes: tuple[int, ...] = ()
    piecewise_buckets: tuple[int, ...] = ()
    single_pass_capture: bool = False
    strict_graph_buffers: bool = False
    graph_top_k: tuple[int, ...] = ()
    overlap: bool = False

    def __post_init__(self) -> None:
        if skip_warmup_pass_from_env():
            object.__setattr__(self, "single_pass_capture", True)
        for name in ("max_batch_size", "max_num_tokens", "block_size"):
            _require_positive(name, getattr(self, name))
        for name in ("num_blocks", "max_model_len"):
            if getattr(self, name) is not None:
                _require_positive(name, getattr(self, name))
        if isinstance(self.dtype, str):
            object.__setattr__(self, "dtype", _dtype_from_name(self.dtype))
        if self.device is not None:
            object.__setattr__(self, "device", str(torch.device(self.device)))
        for name in ("decode_graph_sizes", "piecewise_buckets"):
            values = tuple(getattr(self, name))
            for i, value in enumerate(values):
                _require_positive(f"{name}[{i}]", value)
            object.__setattr__(self, name, values)
        top_k = tuple(self.graph_top_k)
        for i, value in enumerate(top_k):
            _require_positive(f"graph_top_k[{i}]", value)
        object.__setattr__(self, "graph_top_k", tuple(sorted(set(top_k))))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (dtype by name), for reproduction files."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["dtype"] = None if self.dtype is None else str(self.dtype).removeprefix("torch.")
        data["decode_graph_sizes"] = list(self.decode_graph_sizes)
        data["piecewise_buckets"] = list(self.piecewise_buckets)
        data["graph_top_k"] = list(self.graph_top_k)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown EngineConfig fields {unknown}; known are {sorted(known)}")
        return cls(**data)


def skip_warmup_pass_from_env() -> bool:
    """HARNESS_SKIP_WARMUP_PASS=1 opts every config built while it is set into the single pass."""
    return os.environ.get("HARNESS_SKIP_WARMUP_PASS", "") == "1"


def _require_positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"EngineConfig.{name} must be an integer >= 1, got {value!r}")


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"EngineConfig.dtype {name!r} is not a torch dtype name (e.g. 'bfloat16')")
    return dtype
