"""Prefill and mixed batches of `ReferenceLlama` through piecewise graphs, one set per token bucket.

What is compiled is the model's token body (embedding and decoder layers, all tensors of shape
[tokens, ...]) with the token dimension dynamic. Its inputs are tensors only: token ids and per-token
metadata rows sliced to the bucket, the sequence-level metadata, the per-layer KV views and the
attention scratch. The attention op takes them directly, as the model's `Attention` does through
`paged_attention()`; host counts stay outside the graph, so dynamo has no Python int to specialize
on. The final norm and lm_head run eagerly on the real sequences' last rows, as in
`ReferenceLlama.forward`: the graph's output is [bucket, hidden] and is truncated there.

Sizes 0 and 1 are never traced (dynamo would specialize them): the first call is a warmup at the
largest bucket, and buckets are at least `MIN_BUCKET`. A recompile while serving is counted in the
engine's fallbacks, and so is a forward in which the runners were not called (dynamo fell back to
running the body eagerly), so neither goes unseen.
"""

from __future__ import annotations

import types
from typing import Callable, Sequence

import torch

from harness import torch_internals
from harness.graphs.base import GraphBackend
from harness.ops.attention import context_plan, paged_attention_op
from harness.ops.decode_attention import paged_decode_attention_op
from harness.ops.decode_linear_choice import uses_decode_linear
from harness.ops.kv_cache import PagedKVCache
from harness.ops.rope_kv_write import rope_kv_write_op
from harness.ops.metadata import AttentionMetadata
from harness.runtime.piecewise import buckets as bucket_rules
from harness.runtime.piecewise.compile_backend import PiecewiseCompileBackend
from harness.runtime.piecewise.policy import PiecewisePolicy
from harness.runtime.piecewise.runner import CAPTURE, REPLAY, WARMUP
from harness.runtime.stats import StatsRecorder

CAPTURE_PHASE = "piecewise"


def bucket_key(bucket: int) -> str:
    """The graph key of a bucket, as it appears in stats and in `Step.producer`."""
    return f"piecewise[tokens={bucket}]"


def make_token_body(model, decode_kernel: str = "torch", rope_kv_write: str = "separate",
                    decode_linear: str = "separate", pdl: bool = False) -> Callable[..., torch.Tensor]:
    """The token body of `model` as a function of tensors; the hidden states [tokens, hidden] before
    the final norm. Mirrors `ReferenceLlama.forward` through the layers' own pieces (`Attention.qkv`,
    `DecoderLayer.after_attention`); suite piecewise checks it against the eager engine.
    `decode_kernel="triton"` (decode-only bodies: the compiled step) attends through
    `harness::paged_decode_attention`, as `paged_attention()` does for such a batch; `scratch` is
    then unused. `rope_kv_write="fused"` rotates and writes the cache with `harness::rope_kv_write`
    before each attention op, as `Attention.forward` does for such metadata. `decode_linear="fused"`
    (the compiled step, whose token count is static) runs the layers' linear layers as the decode
    GEMV ops where the batch is decode-sized, as `DecoderLayer.forward` does; the piecewise graphs,
    whose token count is dynamic, keep "separate". `pdl`: those ops' Triton kernels are launched
    with Programmatic Dependent Launch (pdl_choice.py), as the metadata's `pdl` says in eager."""
    decode = decode_kernel == "triton"
    fused = rope_kv_write == "fused"

    def token_body(input_ids, positions, slot_mapping, token_to_seq, seq_lens, block_tables,
                   kv_layers, scratch):
        cos, sin = model.rotary(positions)
        plan = None if decode else context_plan(positions, token_to_seq, seq_lens, block_tables,
                                                kv_layers[0].shape[2])
        # Read only when asked for: the shape of a piecewise body is dynamic, not to be guarded on.
        linear = uses_decode_linear(decode_linear, input_ids.shape[0])
        x = model.embed_tokens(input_ids)
        for layer, kv_layer in zip(model.layers, kv_layers):
            attn = layer.self_attn
            qkv = layer.qkv_heads(x, linear, pdl)
            if fused:
                q, k, v = attn.split_heads(qkv)
            else:
                q, k, v = attn.split_heads(attn.rotate_(qkv, cos, sin))
            # Before the fused op, so that it and the attention op are adjacent: one split, no
            # piece between them.
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            if fused:
                rope_kv_write_op(q, k, v, cos, sin, kv_layer, slot_mapping, pdl)
                k = v = None  # in the cache now
            if decode:
                paged_decode_attention_op(q, k, v, kv_layer, slot_mapping, positions, token_to_seq,
                                          seq_lens, block_tables, attn.scale, out, pdl)
            else:
                paged_attention_op(q, k, v, kv_layer, slot_mapping, positions, token_to_seq,
                                   seq_lens, block_tables, attn.scale, out, scratch, plan.blocks,
                                   plan.hidden)
            # x is this segment's input (it crosses the attention op): not written in place.
            x = layer.after_attention(x, out.view(x.shape[0], -1), in_place=False, fused=linear,
                                      pdl=pdl)
        return x

    return own_code(token_body)


def own_code(fn: Callable) -> Callable:
    """`fn` with a code object of its own. Dynamo keeps its cache, and its recompile limit, per
    code object: engines sharing one would evict each other's graphs and, past the limit, silently
    run eagerly."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)


def token_inputs(metadata: AttentionMetadata, input_ids: torch.Tensor,
                 num_tokens: int) -> tuple[torch.Tensor, ...]:
    """The per-token inputs of the body, cut to `num_tokens` rows (the bucket, padding included):
    input_ids, positions, slot_mapping, token_to_seq."""
    return (input_ids[:num_tokens], metadata.positions[:num_tokens],
            metadata.slot_mapping[:num_tokens], metadata.token_to_seq[:num_tokens])


class PiecewiseGraphs:
    """The compiled body of one model over one engine's buffers, captured for every bucket.

    `capture()` warms every bucket (largest first), then captures every bucket; `run(num_seqs,
    bucket)` replays the bucket for the batch the metadata holds (prepared for `bucket` token rows)
    and returns the logits of its `num_seqs` real sequences; `clear()` releases every graph
    (fresh pools for the next capture).
    """

    def __init__(self, model, kv_cache: PagedKVCache, metadata: AttentionMetadata,
                 input_ids: torch.Tensor, buckets: Sequence[int], graph_backend: GraphBackend,
                 stats: StatsRecorder, *, policy: PiecewisePolicy = PiecewisePolicy(),
                 compile_piece: Callable[..., Callable] | None = None) -> None:
        self.model = model
        self.input_ids = input_ids
        self.buckets = bucket_rules.validate_buckets(buckets, metadata.max_num_tokens)
        self.stats = stats
        persistent = {id(t) for t in (*model.parameters(), *model.buffers())}
        self.compile_backend = PiecewiseCompileBackend(
            graph_backend, static_input=lambda t: id(t) in persistent, on_missing=self._count_fallback,
            pools=policy.pools, split_at=policy.split_at, compile_piece=compile_piece)
        self.attach(kv_cache, metadata)
        self._compiled = torch.compile(make_token_body(model, rope_kv_write=metadata.rope_kv_write),
                                       backend=self.compile_backend,
                                       dynamic=False, fullgraph=True)
        self.recompiles = 0

    def attach(self, kv_cache: PagedKVCache, metadata: AttentionMetadata) -> None:
        """Serve from this KV cache and metadata (phase 2 reallocates both); graphs captured against
        the previous ones must be cleared and captured again."""
        self.kv_cache = kv_cache
        self.metadata = metadata
        self.kv_layers = [kv_cache.layer(i) for i in range(self.model.num_layers)]

    @property
    def compiles(self) -> int:
        return self.compile_backend.compiles

    def capture(self) -> None:
        """Two passes over the buckets, largest first: every bucket warms up eagerly (the attention
        scratch reaches its largest size, the first call compiles at a size >= 2), then every
        bucket is captured. The metadata holds a batch of padding only meanwhile."""
        order = sorted(self.buckets, reverse=True)
        for mode in (WARMUP, CAPTURE):
            for bucket in order:
                self.metadata.prepare([], num_tokens=bucket, num_seqs=0)
                self.input_ids[:bucket].zero_()
                self._call(bucket, mode)
                if mode == CAPTURE:
                    self.stats.captures[bucket_key(bucket)] += 1
        self.stats.capture_passes[CAPTURE_PHASE] += 1

    def clear(self) -> None:
        """Release every bucket's graphs; `capture()` records them again into fresh pools."""
        self.compile_backend.clear_piecewise_graphs()

    def run(self, num_seqs: int, bucket: int) -> torch.Tensor:
        """Logits [num_seqs, vocab] (float32) of the batch the metadata holds, through the graphs of
        `bucket` (the metadata must be prepared for `bucket` token rows)."""
        if bucket not in self.buckets:
            raise ValueError(f"tokens={bucket} is not a piecewise bucket; buckets are {list(self.buckets)}")
        if self.metadata.num_tokens != bucket:
            raise ValueError(f"the metadata holds {self.metadata.num_tokens} token rows, the bucket is "
                             f"{bucket}: prepare the batch padded to its bucket")
        compiles = self.compile_backend.compiles
        hidden, segment_calls = self._call(bucket, REPLAY)
        if self.compile_backend.compiles != compiles:
            self.recompiles += 1
            self._count_fallback(f"piecewise recompile while serving tokens={bucket}")
        elif segment_calls != len(self.compile_backend.live_runners):
            self._count_fallback(f"piecewise graphs bypassed at tokens={bucket}: {segment_calls} of "
                                 f"{len(self.compile_backend.live_runners)} segments ran")
        self.stats.replays[bucket_key(bucket)] += 1
        last = hidden.index_select(0, self.metadata.logits_indices[:num_seqs])
        return self.model.lm_head(self.model.norm(last)).float()

    def _call(self, bucket: int, mode: str) -> tuple[torch.Tensor, int]:
        control = self.compile_backend.control
        control.mode, control.num_tokens, control.segment_calls = mode, bucket, 0
        md = self.metadata
        per_token = token_inputs(md, self.input_ids, bucket)
        scratch = self.model.workspace.get(self._scratch_numel(bucket))
        for tensor in (*per_token, scratch):
            torch_internals.mark_dynamic(tensor, 0)
        try:
            with torch.no_grad():
                hidden = self._compiled(*per_token, md.seq_lens, md.block_tables, self.kv_layers, scratch)
        finally:
            control.num_tokens = None
            control.mode = REPLAY
        return hidden, control.segment_calls

    def _scratch_numel(self, bucket: int) -> int:
        # What paged_attention() asks of the workspace: gathered K and V for every token's context.
        md = self.metadata
        return 2 * bucket * md.max_blocks_per_seq * md.block_size * self.kv_cache.num_kv_heads \
            * self.kv_cache.head_dim

    def _count_fallback(self, reason: str) -> None:
        self.stats.fallbacks[reason] += 1
