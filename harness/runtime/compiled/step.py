"""CompiledStep: the model's whole step as one compiled function, inductor pieces between the
attention ops, which the decode graphs capture as they capture the eager model (vLLM's full decode
graphs over its piecewise-compiled model).

The compiled function takes tensors only (`step_arguments`): token ids and per-token metadata rows
cut to the batch's padded token rows, the sequence-level metadata, the rows whose logits are
wanted, the per-layer KV views and the attention scratch. Host counts stay outside, so dynamo
has no Python int to specialise on; it does specialise on shapes (`dynamic=False`), so each padded
batch size gets its own graph and its own kernels, compiled at its first (warmup) step.

After the first call for a shape, the step runs the bytecode dynamo made for it directly, without
evaluating dynamo's guards (vLLM's custom dispatcher, `TorchCompileWrapperWithCustomDispatcher`):
a graph capture runs under the recorder's dispatch and function modes, which dynamo would answer
with a recompile, and the shapes a step is dispatched by (its padded token and sequence counts) are
all that may change between steps. What the compiled region read as a Python value at its compile
is therefore frozen until the next shape; the fault zoo plants that class.

Every dynamo compile is counted (`compiles`). A compile while serving can only be of a shape no
graph holds (a known shape runs its code without guards), so the engine counts it in
`stats.eager_compiles`, by batch: a decode batch that ran outside the graphs was counted in the
fallbacks by its route already, where that was a fallback.
"""

from __future__ import annotations

import time
import types
from typing import Any, Callable

import torch

from harness import torch_internals
from harness.graphs.base import GraphBackend
from harness.ops.kv_cache import PagedKVCache
from harness.ops.metadata import AttentionMetadata
from harness.runtime.compiled.backend import InductorPiecesBackend
from harness.runtime.compiled.piece import CompileInCaptureError
from harness.runtime.piecewise.model import make_token_body, own_code, token_inputs


def make_step_body(model, decode_kernel: str = "torch", rope_kv_write: str = "separate",
                   decode_linear: str = "separate", pdl: bool = False) -> Callable[..., torch.Tensor]:
    """The step as a function of `step_arguments`: the token body (attending decode batches
    through `decode_kernel`, rotating and writing K/V as `rope_kv_write` says, its linear layers
    as `decode_linear` says, the Triton kernels launched with PDL where `pdl` says so), then the
    final norm and lm_head (torch ops, `ReferenceLlama.logits`) on the rows of `logits_indices`;
    logits [rows, vocab] in float32."""
    token_body = make_token_body(model, decode_kernel, rope_kv_write, decode_linear, pdl)

    def step_body(input_ids, positions, slot_mapping, token_to_seq, seq_lens, block_tables,
                  logits_indices, kv_layers, scratch):
        hidden = token_body(input_ids, positions, slot_mapping, token_to_seq, seq_lens, block_tables,
                            kv_layers, scratch)
        return model.logits(hidden.index_select(0, logits_indices))

    return own_code(step_body)


def step_arguments(metadata: AttentionMetadata, input_ids: torch.Tensor, kv_layers: list[torch.Tensor],
                   scratch: torch.Tensor) -> tuple[Any, ...]:
    """The compiled step's arguments for the batch the metadata holds (its padded rows)."""
    return (*token_inputs(metadata, input_ids, metadata.num_tokens), metadata.seq_lens,
            metadata.block_tables, metadata.logits_indices[: metadata.num_seqs], kv_layers, scratch)


def scratch_numel(metadata: AttentionMetadata, kv_cache: PagedKVCache) -> int:
    """What the attention op asks of the workspace: gathered K and V for every token's context."""
    return (2 * metadata.num_tokens * metadata.max_blocks_per_seq * metadata.block_size
            * kv_cache.num_kv_heads * kv_cache.head_dim)


class CompiledStep:
    """`step(input_ids, metadata, kv_cache)`: what `ReferenceLlama.forward` returns, computed by the
    compiled step. `graph_backend` is the backend that captures it (None: no graphs); the step
    serves decode batches only, so `decode_kernel` (the engine's, as its metadata carries it)
    says how it attends; `rope_kv_write` (the same) how it rotates and stores K/V; `decode_linear`
    (the same) how its linear layers run; `pdl` (the same) whether the Triton kernels are
    launched with Programmatic Dependent Launch, and inductor's own kernels too where this
    torch's inductor has the option (`piece.inductor_options`)."""

    def __init__(self, model, graph_backend: GraphBackend | None, decode_kernel: str = "torch",
                 rope_kv_write: str = "separate", decode_linear: str = "separate",
                 pdl: bool = False) -> None:
        self.model = model
        self.backend = InductorPiecesBackend(graph_backend, pdl=pdl)
        self.graph_backend = graph_backend
        self.decode_kernel = decode_kernel
        self.rope_kv_write = rope_kv_write
        self.decode_linear = decode_linear
        self.pdl = pdl
        self._body = make_step_body(model, decode_kernel, rope_kv_write, decode_linear, pdl)
        self._compiled = torch.compile(self._body, backend=self.backend, dynamic=False, fullgraph=True)
        # (num_tokens, num_seqs, KV layer shape) -> the function running dynamo's bytecode for it.
        self._dispatch: dict[tuple[Any, ...], Callable[..., torch.Tensor]] = {}
        # The same key -> seconds its dynamo and inductor compiles took (host time, first call).
        self.compile_seconds: dict[tuple[Any, ...], float] = {}
        self._kv_layers: tuple[PagedKVCache | None, list[torch.Tensor]] = (None, [])

    @property
    def compiles(self) -> int:
        """Dynamo graphs compiled so far (one per padded batch size, unless a guard failed)."""
        return self.backend.counts.graphs

    @property
    def piece_compiles(self) -> int:
        return self.backend.counts.pieces

    def __call__(self, input_ids: torch.Tensor, metadata: AttentionMetadata,
                 kv_cache: PagedKVCache) -> torch.Tensor:
        if input_ids.shape[0] < metadata.num_tokens:
            raise ValueError(f"input_ids holds {input_ids.shape[0]} tokens, the metadata describes "
                             f"{metadata.num_tokens}")
        for name in ("decode_kernel", "rope_kv_write", "decode_linear"):
            built, asked = getattr(self, name), getattr(metadata, name)
            if asked != built:
                raise ValueError(f"compiled step: built for {name} {built!r}, the metadata asks "
                                 f"for {asked!r}; build both from one EngineConfig")
        if metadata.pdl != self.pdl:
            raise ValueError(f"compiled step: built for pdl={self.pdl}, the metadata asks for "
                             f"pdl={metadata.pdl}; build both from one EngineConfig")
        # The decode kernel reads the cache in place: no gathered context to make room for.
        numel = 0 if self.decode_kernel == "triton" else scratch_numel(metadata, kv_cache)
        scratch = self.model.workspace.get(numel)
        args = step_arguments(metadata, input_ids, self._layers(kv_cache), scratch)
        # The KV cache's shape is in the key as its sizes are in the kernels: an engine sharing this
        # step (Engine(compiled_step=...)) with another cache gets its own compile, not wrong kernels.
        key = (metadata.num_tokens, metadata.num_seqs, tuple(kv_cache.layer(0).shape))
        with torch.no_grad():
            compiled = self._dispatch.get(key)
            if compiled is not None:
                return compiled(*args)
            if self.graph_backend is not None and self.graph_backend.is_capturing():
                raise CompileInCaptureError(
                    f"compiled step: no compile for {key[0]} token rows and {key[1]} sequences, and "
                    f"dynamo would compile it inside a graph capture; run the shape once before "
                    f"capturing it (the warmup forward)", op="compiled step")
            return self._compile_and_run(key, args)

    def _compile_and_run(self, key: tuple[Any, ...], args: tuple[Any, ...]) -> torch.Tensor:
        made: list[types.CodeType] = []
        start = time.perf_counter()

        def keep(old_code: types.CodeType, new_code: types.CodeType) -> None:
            if old_code is self._body.__code__:
                made.append(new_code)

        handle = torch_internals.lazy_module("dynamo_convert_frame").register_bytecode_hook(keep)
        try:
            result = self._compiled(*args)
        finally:
            handle.remove()
        self.compile_seconds[key] = time.perf_counter() - start
        if made:
            body = self._body
            self._dispatch[key] = types.FunctionType(made[-1], body.__globals__, body.__name__,
                                                     body.__defaults__, body.__closure__)
        return result

    def _layers(self, kv_cache: PagedKVCache) -> list[torch.Tensor]:
        # One list per KV cache, kept: dynamo guards on the list, and a new list of the same views
        # every step would cost a guard walk for nothing.
        cache, layers = self._kv_layers
        if cache is not kv_cache:
            layers = [kv_cache.layer(i) for i in range(self.model.num_layers)]
            self._kv_layers = (kv_cache, layers)
        return layers
