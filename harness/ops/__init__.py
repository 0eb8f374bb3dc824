"""Reference attention ops and their state: paged KV cache, attention metadata, workspace.

Typical use by a model layer (shapes: T = metadata.num_tokens, padding included)::

    cache = PagedKVCache(num_layers, num_blocks, block_size, kv_heads, head_dim, torch.bfloat16, dev)
    metadata = AttentionMetadata(max_batch_size, max_num_tokens, max_blocks_per_seq, block_size,
                                 cache.pad_slot, dev)
    blocks = cache.allocator.allocate(cache.blocks_for(len(prompt)))
    metadata.prepare([SequenceSpan(seq_len=len(prompt), query_len=len(prompt), block_table=blocks)],
                     num_tokens=bucket)              # outside capture; pads to `bucket` rows
    positions = metadata.input_positions()          # == metadata.positions[:T], int64
    paged_attention(q, k, v, cache.layer(i), metadata, scale, out, workspace=None)
        # q/out [T, heads, head_dim], k/v [T, kv_heads, head_dim], same dtype as the cache;
        # writes k/v into the cache first, then `out`; padded rows come out as zeros
    hidden[metadata.logits_rows()]                  # == logits_indices[:num_seqs]: last token rows
    block_sparse_attention(q, k, v, cache.layer(i), metadata, scale, out, top_k)

Sequences go prefill first, decodes after (`SequenceSpan.is_decode`: one new token on a cached
prefix). `metadata.prepare` copies into preallocated buffers (never rebinds), so graphs captured
against them see every later batch; its host counts (`num_tokens`, `num_seqs`, `num_prefills`,
`num_prefill_tokens`, `num_decodes`, `num_decode_tokens`) describe the padded batch;
`num_actual_tokens` / `num_actual_seqs` say how many rows are real. Padded token rows belong to
the permanent pad sequence (row `max_batch_size` of `seq_lens` / `block_tables`). The ops are
`torch.ops.harness.paged_attention` and `torch.ops.harness.block_sparse_attention`
(mutating the KV layer and `out`, returning nothing, fakes registered), and read no device data on
the host, so they can be captured. A decode-only batch whose metadata was built with
`decode_kernel="triton"` attends through `torch.ops.harness.paged_decode_attention` instead: a Triton
kernel reading the cache through the block table on CUDA, the torch ops elsewhere (decode_kernel.py
chooses; `choose_decode_kernel(None, device)` is the engine's default). Metadata built with
`rope_kv_write="fused"` tells the model to rotate q and k and write K/V with
`torch.ops.harness.rope_kv_write` (`rope_kv_write(q, k, v, cos, sin, kv_layer, slot_mapping)`: a
Triton kernel on CUDA, the torch ops elsewhere) and call the attention op with k = v = None (the
cache already written); rope_kv_choice.py chooses. Metadata built with `decode_linear="fused"`
tells the model to run a decode-sized batch's linear layers as `torch.ops.harness.norm_gemv`
(norm + qkv_proj), `gemv_residual` (o_proj, down_proj + the residual) and
`norm_gemv_silu_mul` (norm + gate_up_proj + SiLU-and-multiply): Triton GEMV kernels on CUDA, the
torch ops elsewhere (decode_linear.py; decode_linear_choice.py chooses). Metadata built with
`pdl=True` has those ops launch their Triton kernels with Programmatic Dependent Launch
(pdl_choice.py chooses; the torch implementations ignore it).
"""

from harness.ops.attention import paged_attention, paged_attention_op
from harness.ops.decode_attention import paged_decode_attention_op
from harness.ops.decode_kernel import DECODE_KERNELS, DecodeKernelChoice, choose_decode_kernel
from harness.ops.decode_linear import (gemv_residual, gemv_residual_op, norm_gemv, norm_gemv_op,
                                       norm_gemv_silu_mul, norm_gemv_silu_mul_op)
from harness.ops.decode_linear_choice import (DECODE_LINEAR_MAX_TOKENS, DECODE_LINEARS,
                                              DecodeLinearChoice, choose_decode_linear)
from harness.ops.kv_cache import BlockAllocator, OutOfBlocksError, PagedKVCache
from harness.ops.metadata import AttentionMetadata, BatchCounts, SequenceSpan
from harness.ops.rope_kv_choice import ROPE_KV_WRITES, RopeKvChoice, choose_rope_kv_write
from harness.ops.rope_kv_write import rope_kv_write, rope_kv_write_op
from harness.ops.sparse_attention import block_sparse_attention, block_sparse_attention_op
from harness.ops.workspace import Workspace

__all__ = [
    "AttentionMetadata", "BatchCounts", "BlockAllocator", "DECODE_KERNELS", "DECODE_LINEARS",
    "DECODE_LINEAR_MAX_TOKENS", "DecodeKernelChoice", "DecodeLinearChoice",
    "OutOfBlocksError", "PagedKVCache", "ROPE_KV_WRITES", "RopeKvChoice",
    "SequenceSpan", "Workspace", "block_sparse_attention", "block_sparse_attention_op",
    "choose_decode_kernel", "choose_decode_linear", "choose_rope_kv_write", "gemv_residual",
    "gemv_residual_op", "norm_gemv", "norm_gemv_op", "norm_gemv_silu_mul", "norm_gemv_silu_mul_op",
    "paged_attention", "paged_attention_op",
    "paged_decode_attention_op", "rope_kv_write", "rope_kv_write_op",
]
