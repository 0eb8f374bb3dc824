"""Batches for the decode-kernel tests: random paged batches (suites/ops/batches.py) whose cache
holds NaN wherever no sequence wrote, so a kernel that reads past a sequence's length, or a block
its table does not list, turns its output NaN; and the tolerance the kernel is held to per dtype."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from harness.ops import AttentionMetadata, paged_attention
from harness.ops.attention import paged_attention_impl
from suites.ops.batches import Batch, make_batch


def poison_unwritten(batch: Batch) -> None:
    """NaN in every cache slot no real sequence's history fills (the pad sink included)."""
    flat = batch.cache.layer(0).flatten(1, 2)
    written = torch.zeros(flat.shape[1], dtype=torch.bool)
    bs = batch.cache.block_size
    for span in batch.spans:
        for position in range(span.seq_len):
            written[span.block_table[position // bs] * bs + position % bs] = True
    flat[:, ~written.to(flat.device)] = float("nan")


def write_new_tokens(batch: Batch) -> None:
    """Store the batch's new K/V as the op would, before a kernel that only reads is called."""
    flat = batch.cache.layer(0).flatten(1, 2)
    slots = batch.metadata.slot_mapping[: batch.metadata.num_tokens]
    flat[0].index_copy_(0, slots, batch.k)
    flat[1].index_copy_(0, slots, batch.v)


def torch_ops_output(batch: Batch, scale: float) -> torch.Tensor:
    """What the torch-ops implementation (today's gather path) writes, on a copy of the cache."""
    out = torch.empty_like(batch.q)
    paged_attention_impl(batch.q, batch.k, batch.v, batch.cache.layer(0).clone(),
                         *batch.metadata.op_inputs(), scale, out, None)
    return out


def tolerance(reference: torch.Tensor, values: torch.Tensor, dtype: torch.dtype) -> float:
    """Steps of the dtype's spacing at the larger of the output's and the values' magnitude: the
    two paths round scores and probabilities at different points, each off by a step or two of
    what they average (fp32 sums of a few dozen terms by a few more steps)."""
    steps = 16 if dtype == torch.float32 else 3
    magnitude = max(reference.abs().max().item(), values.abs().max().item(), 1.0)
    return steps * torch.finfo(dtype).eps * magnitude


@st.composite
def kernel_batches(draw) -> dict:
    """make_batch arguments: mostly decodes, some prefills first, GQA groups 1-4 (3 included: not a
    power of two), head dims and block sizes that are and are not powers of two, padding."""
    kv_heads = draw(st.integers(1, 3))
    group = draw(st.integers(1, 4))
    decodes = draw(st.lists(st.integers(2, 40), min_size=0, max_size=4))
    prefills = draw(st.lists(st.integers(1, 6), min_size=0 if decodes else 1, max_size=2))
    lengths = [(n, n) for n in prefills] + [(n, 1) for n in decodes]
    return dict(lengths=lengths, heads=kv_heads * group, kv_heads=kv_heads,
                head_dim=draw(st.sampled_from([8, 12, 16])),
                block_size=draw(st.sampled_from([1, 3, 4, 16])),
                pad_tokens=draw(st.integers(0, 2)), pad_seqs=draw(st.integers(0, 1)),
                dtype=draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32])),
                seed=draw(st.integers(0, 2**16)))


def decode_batch(**composition) -> Batch:
    batch = make_batch(**composition)
    poison_unwritten(batch)
    return batch


def replay_on_a_later_batch(first: Batch, later: Batch, metadata: AttentionMetadata,
                            scale: float) -> torch.Tensor:
    """Attend `first` once eagerly (the kernel's first launch, outside capture), capture it, then
    copy `later`'s cache, metadata and q/k/v into the captured buffers and replay: the output."""
    layer = first.cache.layer(0)
    q, k, v = first.q.clone(), first.k.clone(), first.v.clone()
    out = torch.zeros_like(q)
    paged_attention(q, k, v, layer, metadata, scale, out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_attention(q, k, v, layer, metadata, scale, out)
    layer.copy_(later.cache.layer(0))
    metadata.prepare(later.spans, num_tokens=metadata.max_num_tokens, num_seqs=metadata.max_batch_size)
    q.copy_(later.q), k.copy_(later.k), v.copy_(later.v)
    graph.replay()
    torch.cuda.synchronize()
    return out
