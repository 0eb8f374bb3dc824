"""EngineConfig: the engine's sizes and switches, frozen so a run can be saved and replayed."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

import torch

from harness.ops.decode_kernel import DECODE_KERNELS
from harness.ops.decode_linear_choice import DECODE_LINEARS
from harness.ops.greedy_ranking_choice import GREEDY_RANKINGS
from harness.ops.rope_kv_choice import ROPE_KV_WRITES

# EngineConfig.compile: the eager torch ops, or inductor pieces between the attention ops.
COMPILE_MODES = ("none", "inductor")
COMPILE_NOT_GIVEN = None  # EngineConfig.compile's default: "none" unless a session default fills it


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
    - `piecewise_buckets`: token counts to capture piecewise prefill graphs for (empty: none): a
      prefill or mixed batch replays the smallest bucket that holds its token rows.
    - `single_pass_capture`: opt in to single-pass decode capture. None (the default) means not
      given: two passes, unless a session default fills it (`fill_unset`, with
      `engine_defaults_from_env`: HARNESS_SKIP_WARMUP_PASS=1, read once by the pytest fixtures and
      the CLI). An explicit True or False, from the constructor, `from_dict` or `replace()`, stays.
    - `strict_graph_buffers`: check, before every decode-graph replay, that no tensor the graph
      baked in has moved, and raise naming it.
    - `graph_top_k`: the sampling variants of the decode graphs, as how many top logprobs each graph
      ranks on the device (deduplicated and sorted). Empty: graphs output logits and the host ranks
      them (variant "greedy"). Set: one graph per (size, k), variant f"top{k}"; a decode batch
      replays the smallest k >= its largest requested `logprobs` (at least 1), and a batch wanting
      more than every k runs eagerly, counted in `stats.fallbacks`.

    Compiled path:
    - `compile`: "none" runs the model's torch ops as they are; "inductor" compiles the static
      pieces between the attention ops with inductor (runtime/compiled/), as vLLM does: decode
      steps run the compiled step and the decode graphs capture it, piecewise prefill graphs
      capture compiled pieces. Prefill and mixed batches outside a bucket run the eager ops. None
      (the default) means not given: "none", unless a session default fills it (`fill_unset`: the
      pytest option `--engine-compile inductor` runs the suites' engines on the compiled path).

    Attention:
    - `decode_kernel`: what attends decode-only batches (harness/ops/decode_kernel.py). None (the
      default) chooses for the device: "triton" (the paged-decode kernel, reading the cache through
      the block table) on a real CUDA device where triton imports, else "torch" (the gather path
      every other batch takes); a CUDA device without triton is counted in `stats.fallbacks`.
      "triton" or "torch" asks for one; "triton" where it cannot run is refused.
    - `rope_kv_write`: how each layer rotates q and k and stores K/V (harness/ops/rope_kv_choice.py).
      "fused": one op, `harness::rope_kv_write` (a Triton kernel on CUDA, the torch ops elsewhere),
      before the attention op, which then finds the cache written; "separate": rope in the model's
      torch ops, the K/V write inside the attention op. None (the default) chooses for the device:
      "fused" on a real CUDA device where triton imports, else "separate"; a CUDA device without
      triton is counted in `stats.fallbacks`. "fused" on CUDA without triton is refused.

    Linear layers:
    - `decode_linear`: how the layers' linear layers run for decode-sized batches (at most
      `DECODE_LINEAR_MAX_TOKENS` = 8 token rows; harness/ops/decode_linear_choice.py). "fused":
      three decode GEMV ops per layer carrying the norm, residual add and SiLU-and-multiply next to
      them (`harness::norm_gemv`, `gemv_residual`, `norm_gemv_silu_mul`: Triton kernels on CUDA,
      the separate path's torch ops elsewhere); the final norm + lm_head stay on the torch ops
      (cuBLAS is faster at the vocabulary's width);
      "separate": the model's torch ops. Larger batches (prefill, the piecewise graphs, big decode
      batches) always take torch's matmul, where a GEMM kernel beats a GEMV. None (the default)
      chooses for the device: "fused" on a real CUDA device where triton imports, else
      "separate"; a CUDA device without triton is counted in `stats.fallbacks`. "fused" on CUDA
      without triton is refused.

    Ranking:
    - `greedy_ranking`: how a top-1 decode graph (`graph_top_k` holding 1) ranks its logits, for
      batches whose every sequence wants the greedy token alone (harness/ops/greedy_ranking_choice.py).
      "fused": `harness::greedy_pack`, two Triton kernels on CUDA giving the token (bit for bit
      the torch path's), its logprob (to a few fp32 ulps) and the logit scale, where the torch
      ops run about ten kernels; the torch ops elsewhere. "separate": `rank_logits` and
      `pack_ranked`. None (the default) chooses for the device: "fused" on a real CUDA device
      where triton imports, else "separate"; a CUDA device without triton is counted in
      `stats.fallbacks`. "fused" on CUDA without triton is refused. Eager steps (the reference the
      graphs are compared with, and the overlap loop's) always rank with the torch ops.

    Kernel launches:
    - `pdl`: whether the Triton kernels of the options above (decode GEMVs, rope + KV write, paged
      decode attention, greedy ranking) are launched with Programmatic Dependent Launch
      (harness/ops/pdl_choice.py): each may start while the kernel before it drains, loads what no
      earlier kernel writes (the GEMVs' first weight tile), then waits for it; on the compiled
      path inductor's own Triton kernels too, where its `triton.enable_pdl` option exists. None
      (the default) chooses for the device: on where it can run (a real CUDA device of compute
      capability >= 9.0, a triton with `gdc_wait`, `gdc_launch_dependents` and `launch_pdl`),
      else off; such a device whose triton lacks them is counted in `stats.fallbacks`. True where
      it cannot run is refused, naming what is missing; False is off. The torch implementations
      (CPU, the emulated CUDA device) have no launches to change: numerics are the same.

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
    single_pass_capture: bool | None = None
    strict_graph_buffers: bool = False
    graph_top_k: tuple[int, ...] = ()
    overlap: bool = False
    compile: str | None = COMPILE_NOT_GIVEN
    decode_kernel: str | None = None
    rope_kv_write: str | None = None
    decode_linear: str | None = None
    greedy_ranking: str | None = None
    pdl: bool | None = None

    def __post_init__(self) -> None:
        if self.pdl is not None and not isinstance(self.pdl, bool):
            raise ValueError(f"EngineConfig.pdl must be True, False or None (choose for the device), "
                             f"got {self.pdl!r}")
        for name, options in (("decode_kernel", DECODE_KERNELS), ("rope_kv_write", ROPE_KV_WRITES),
                              ("decode_linear", DECODE_LINEARS),
                              ("greedy_ranking", GREEDY_RANKINGS)):
            value = getattr(self, name)
            if value is not None and value not in options:
                raise ValueError(f"EngineConfig.{name} must be one of {list(options)} or None "
                                 f"(choose for the device), got {value!r}")
        if self.compile is not COMPILE_NOT_GIVEN and self.compile not in COMPILE_MODES:
            raise ValueError(f"EngineConfig.compile must be one of {list(COMPILE_MODES)}, got "
                             f"{self.compile!r}")
        if self.single_pass_capture is not None and not isinstance(self.single_pass_capture, bool):
            raise ValueError(f"EngineConfig.single_pass_capture must be True, False or None (not given), "
                             f"got {self.single_pass_capture!r}")
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


SKIP_WARMUP_PASS_VARIABLE = "HARNESS_SKIP_WARMUP_PASS"


def engine_defaults_from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """The session defaults the environment asks for, as EngineConfig fields: `single_pass_capture`
    True when HARNESS_SKIP_WARMUP_PASS=1. Read once where a session starts (the pytest fixtures, the
    CLI), never when a config is built."""
    return {"single_pass_capture": True} if environ.get(SKIP_WARMUP_PASS_VARIABLE, "") == "1" else {}


def fill_unset(config: EngineConfig, defaults: Mapping[str, Any]) -> EngineConfig:
    """`config` with each field in `defaults` filled where the config leaves it None (not given)."""
    unknown = sorted(set(defaults) - {f.name for f in fields(config)})
    if unknown:
        raise ValueError(f"unknown EngineConfig fields {unknown} in defaults; known are "
                         f"{sorted(f.name for f in fields(config))}")
    unset = {name: value for name, value in defaults.items() if getattr(config, name) is None}
    return replace(config, **unset) if unset else config


def _require_positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"EngineConfig.{name} must be an integer >= 1, got {value!r}")


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"EngineConfig.dtype {name!r} is not a torch dtype name (e.g. 'bfloat16')")
    return dtype
