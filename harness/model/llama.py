"""ReferenceLlama: a Llama decoder whose attention runs through the harness's paged-attention op.

Tokens of all sequences in a batch are flattened into one row per token ([num_tokens, hidden]);
the attention metadata says which sequence, position and KV slot each row belongs to. Every shape in
`forward` comes from the metadata's host counts (num_tokens, num_seqs), never from a device value, so a
forward can be captured into a graph for one padded shape and replayed for any batch of that shape.

Numerics mirror transformers' Llama so it serves as an independent oracle: weights and activations in
the model dtype (bf16), RMSNorm and softmax in fp32, RoPE applied in the model dtype. The decode step
is laid out for few, large kernels (the ones a serving runtime fuses with torch ops alone): q/k/v and
gate/up each one GEMM over weights concatenated at load, RMSNorm one `rms_norm`, rotary from one
table gathered once per forward and applied in place, each residual add folded into the GEMM before
it, and what each token attends to (`ContextPlan`) computed once per forward for every layer. With
`metadata.decode_linear == "fused"` a decode-sized batch runs each layer's linear layers as three
decode GEMV ops carrying the norm, residual add and SiLU-and-multiply next to them
(harness/ops/decode_linear.py); the final norm + lm_head stay on the torch ops (cuBLAS is faster
at the vocabulary's width). These
round differently from transformers at a few points (one rounding where it rounds twice); the model
suites hold them to BF16 tolerance. The returned
logits are the lm_head output in the model dtype, cast to fp32 ([num_seqs, vocab], float32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig

from harness.model.rope import RotaryTable
from harness.model.weights import hf_state_dict
from harness.ops.attention import ContextPlan, metadata_plan, paged_attention
from harness.ops.decode_linear import gemv_residual, norm_gemv, norm_gemv_silu_mul
from harness.ops.decode_linear_choice import uses_decode_linear
from harness.ops.kv_cache import PagedKVCache
from harness.ops.metadata import AttentionMetadata
from harness.ops.rope_kv_write import rope_kv_write
from harness.ops.rotary import apply_rotary_
from harness.ops.workspace import Workspace


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # transformers' numerics (normalize in fp32, round, then scale by the weight), and one
        # kernel where torch fuses it (CUDA); elsewhere torch runs the same steps one op each.
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def add_linear_(residual: torch.Tensor, x: torch.Tensor, linear: nn.Linear, *,
                in_place: bool = True) -> torch.Tensor:
    """residual + linear(x) as one GEMM that accumulates into the residual (`addmm` with beta=1),
    in place unless `in_place` is False (a compiled segment may not write its inputs)."""
    if in_place:
        out = residual.addmm_(x, linear.weight.t())
    else:
        out = torch.addmm(residual, x, linear.weight.t())
    return out if linear.bias is None else out.add_(linear.bias)


class Attention(nn.Module):
    """q, k and v come from one fused projection (`qkv_proj`, the three weights concatenated at
    load); q and k are rotated together, in place, since they are adjacent in its output. With
    `metadata.rope_kv_write == "fused"` one op (`harness::rope_kv_write`) rotates them and writes
    the cache, and the attention op is told the cache is written (k = v = None)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.scale = self.head_dim ** -0.5
        bias = bool(getattr(config, "attention_bias", False))
        heads = self.num_heads + 2 * self.num_kv_heads
        self.qkv_proj = nn.Linear(config.hidden_size, heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)

    def projected(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [tokens, heads, head_dim], k and v [tokens, kv_heads, head_dim], not rotated: views of
        one buffer."""
        return self.split_heads(self.heads(self.qkv_proj(x)))

    def qkv(self, x: torch.Tensor, cos: torch.Tensor,
            sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`projected(x)` with q and k rotated."""
        return self.split_heads(self.rotate_(self.heads(self.qkv_proj(x)), cos, sin))

    def heads(self, projection: torch.Tensor) -> torch.Tensor:
        """qkv_proj's output [tokens, (heads + 2 kv_heads) * head_dim] as one row per head."""
        return projection.view(projection.shape[0], self.num_heads + 2 * self.num_kv_heads,
                               self.head_dim)

    def rotate_(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """`heads()` output with its q and k heads rotated in place."""
        apply_rotary_(qkv[:, : self.num_heads + self.num_kv_heads], cos, sin)
        return qkv

    def split_heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return qkv.split((self.num_heads, self.num_kv_heads, self.num_kv_heads), dim=1)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_layer: torch.Tensor,
                metadata: AttentionMetadata, workspace: Workspace,
                plan: ContextPlan | None = None) -> torch.Tensor:
        """The attention output before o_proj, [tokens, heads * head_dim]."""
        return self.attend(self.heads(self.qkv_proj(x)), cos, sin, kv_layer, metadata, workspace,
                           plan)

    def attend(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_layer: torch.Tensor,
               metadata: AttentionMetadata, workspace: Workspace,
               plan: ContextPlan | None = None) -> torch.Tensor:
        """`forward` from the projection already made (`heads()` layout, not rotated)."""
        tokens = qkv.shape[0]
        if metadata.rope_kv_write == "fused":
            q, k, v = self.split_heads(qkv)
            rope_kv_write(q, k, v, cos, sin, kv_layer, metadata.slot_mapping[: metadata.num_tokens],
                          metadata.pdl)
            k = v = None  # in the cache now
        else:
            q, k, v = self.split_heads(self.rotate_(qkv, cos, sin))
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        paged_attention(q, k, v, kv_layer, metadata, self.scale, out, workspace=workspace, plan=plan)
        return out.view(tokens, self.num_heads * self.head_dim)


class MLP(nn.Module):
    """gate and up come from one fused projection (`gate_up_proj`, concatenated at load)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        if config.hidden_act != "silu":
            raise ValueError(f"hidden_act {config.hidden_act!r} is not supported; ReferenceLlama implements 'silu'")
        bias = bool(getattr(config, "mlp_bias", False))
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)

    def activation(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate(x)) * up(x), the input of down_proj."""
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return F.silu(gate) * up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activation(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def qkv_heads(self, x: torch.Tensor, fused: bool = False, pdl: bool = False) -> torch.Tensor:
        """The attention's q, k and v projection of the layer input `x` (normalised first), not
        rotated, in `Attention.heads()` layout. `fused`: one `harness::norm_gemv`, the norm
        inside it (decode-sized batches; decode_linear_choice.py), its kernel launched with PDL
        where `pdl` says so (pdl_choice.py)."""
        attn, norm = self.self_attn, self.input_layernorm
        if fused:
            projection = norm_gemv(x, norm.weight, norm.eps, attn.qkv_proj.weight, attn.qkv_proj.bias,
                                   pdl)
        else:
            projection = attn.qkv_proj(norm(x))
        return attn.heads(projection)

    def after_attention(self, x: torch.Tensor, attended: torch.Tensor, *,
                        in_place: bool = True, fused: bool = False,
                        pdl: bool = False) -> torch.Tensor:
        """The layer's output from its input `x` and its attention output: both residual adds
        ride on the GEMM before them (o_proj, down_proj). `fused`: three decode GEMV ops, o_proj +
        residual, norm + gate_up + SiLU-and-multiply, down_proj + residual (each a new tensor, so
        `in_place` does not apply; `pdl` launches their kernels with PDL)."""
        if fused:
            o_proj, mlp, norm = self.self_attn.o_proj, self.mlp, self.post_attention_layernorm
            x = gemv_residual(attended, o_proj.weight, o_proj.bias, x, pdl)
            act = norm_gemv_silu_mul(x, norm.weight, norm.eps, mlp.gate_up_proj.weight,
                                     mlp.gate_up_proj.bias, pdl)
            return gemv_residual(act, mlp.down_proj.weight, mlp.down_proj.bias, x, pdl)
        x = add_linear_(x, attended, self.self_attn.o_proj, in_place=in_place)
        return add_linear_(x, self.mlp.activation(self.post_attention_layernorm(x)), self.mlp.down_proj)

    def forward(self, x, cos, sin, kv_layer, metadata, workspace, plan=None):
        fused = uses_decode_linear(metadata.decode_linear, x.shape[0])
        attended = self.self_attn.attend(self.qkv_heads(x, fused, metadata.pdl), cos, sin, kv_layer,
                                         metadata, workspace, plan)
        return self.after_attention(x, attended, fused=fused, pdl=metadata.pdl)


class ReferenceLlama(nn.Module):
    """Llama decoder on paged attention. Build it with `from_hf`; call it with
    `forward(input_ids, metadata, kv_cache)` where `input_ids` holds at least `metadata.num_tokens`
    token ids (padded tail rows included)."""

    def __init__(self, config: LlamaConfig, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryTable(config, dtype)
        self.to(dtype)
        # Scratch shared by every attention layer. It regrows when a larger batch comes: the hazard
        # that two-pass capture exists for, so it is state the graph machinery has to see.
        self.workspace = Workspace(dtype, self.embed_tokens.weight.device)

    # Shape facts the engine sizes the KV cache and its limits from.
    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def num_kv_heads(self) -> int:
        return self.config.num_key_value_heads

    @property
    def head_dim(self) -> int:
        return self.layers[0].self_attn.head_dim

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_positions(self) -> int:
        return self.config.max_position_embeddings

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @classmethod
    def from_hf(cls, hf_model) -> ReferenceLlama:
        """Copy the weights of a transformers `LlamaForCausalLM` (same device and dtype as it)."""
        config = hf_model.config
        weight = hf_model.lm_head.weight
        # nn.Linear initialises itself from the global RNG before the weights are overwritten;
        # fork it so loading a model leaves the caller's random state as it was.
        cuda = [weight.device] if weight.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda), torch.device(weight.device):
            model = cls(config, dtype=weight.dtype)
        missing, unexpected = model.load_state_dict(hf_state_dict(hf_model), strict=False)
        missing = [m for m in missing if not m.startswith("rotary.")]
        if config.tie_word_embeddings:
            missing = [m for m in missing if m != "lm_head.weight"]
        if missing or unexpected:
            raise ValueError(f"weights of {type(hf_model).__name__} do not fit ReferenceLlama: "
                             f"missing {missing}, unexpected {unexpected}")
        return model.eval()

    def _apply(self, fn, *args, **kwargs):
        # .to(device) moves parameters and buffers; the workspace is neither, so follow along.
        result = super()._apply(fn, *args, **kwargs)
        weight = self.embed_tokens.weight
        workspace = getattr(self, "workspace", None)  # absent while __init__ runs
        if workspace is not None and (workspace.tensor.device, workspace.dtype) != (weight.device, weight.dtype):
            self.workspace = Workspace(weight.dtype, weight.device)
        return result

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, metadata: AttentionMetadata, kv_cache: PagedKVCache) -> torch.Tensor:
        """Logits [metadata.num_seqs, vocab] (float32) of each sequence's last token in the batch."""
        num_tokens, num_seqs = metadata.num_tokens, metadata.num_seqs
        if input_ids.shape[0] < num_tokens:
            raise ValueError(f"input_ids holds {input_ids.shape[0]} tokens, "
                             f"the metadata describes {num_tokens}")
        positions = metadata.positions[:num_tokens]
        cos, sin = self.rotary(positions)
        # What each token attends to, the same in every layer; the decode kernel reads the
        # metadata itself.
        plan = None if metadata.uses_decode_kernel else metadata_plan(metadata)
        x = self.embed_tokens(input_ids[:num_tokens])
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, kv_cache.layer(i), metadata, self.workspace, plan)
        last = x.index_select(0, metadata.logits_indices[:num_seqs])
        return self.logits(last)

    def logits(self, last: torch.Tensor) -> torch.Tensor:
        """lm_head(norm(last)) as float32, [rows, vocab], in the torch ops whatever the decode-linear
        mode: at the lm_head's shape (vocab x hidden, 128256 x 2048 for the 1B) cuBLAS's GEMV is
        faster than the Triton `norm_gemv` (135 against 152 us on the H200), and the per-layer
        shapes are where the fused ops win."""
        return self.lm_head(self.norm(last)).float()
