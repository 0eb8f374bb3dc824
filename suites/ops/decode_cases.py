"""Batches for the decode-kernel tests: random paged batches (suites/ops/batches.py) whose cache
holds NaN wherever no sequence wrote, so a kernel that reads past a sequence's length, or a block
its table does not list, turns its output NaN; the tolerance the kernel is held to per dtype; and
the kernel's launch and check the kernel tests share (`kernel_output`, `assert_kernel_matches`)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from harness.ops import AttentionMetadata, paged_attention
from harness.ops.attention import paged_attention_impl
from suites.ops.batches import Batch, make_batch
from suites.ops.reference import naive_attention


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


SCALE = 0.35


def kernel_output(batch: Batch, scale: float = SCALE, **launch) -> torch.Tensor:
    """The kernel's output on `batch`; `launch` goes to the launcher (num_splits, tile_tokens)."""
    from harness.ops.triton_decode import paged_decode_triton

    write_new_tokens(batch)
    out = torch.full_like(batch.q, 7.0)
    _, positions, token_to_seq, seq_lens, block_tables = batch.metadata.op_inputs()
    paged_decode_triton(batch.q, batch.cache.layer(0), positions, token_to_seq, seq_lens,
                        block_tables, scale, out, **launch)
    return out


def assert_kernel_matches(batch: Batch, out: torch.Tensor, scale: float = SCALE) -> None:
    """Real rows within tolerance of the torch-ops path and of the float64 reference; padded rows
    (they see nothing) zero."""
    n, dtype = batch.num_actual_tokens, batch.q.dtype
    values = torch.cat(batch.values).float()
    expected = naive_attention(batch.queries, batch.keys, batch.values, scale)
    torch_ops = torch_ops_output(batch, scale)[:n].double().cpu()
    real = out[:n].double().cpu()
    limit = tolerance(expected, values, dtype)
    against_reference = (real - expected).abs().max().item()
    against_torch_ops = (real - torch_ops).abs().max().item()
    assert against_reference <= limit, f"{against_reference:.3g} from the float64 reference > {limit:.3g}"
    assert against_torch_ops <= 2 * limit, f"{against_torch_ops:.3g} from the torch-ops path > {2 * limit:.3g}"
    assert not out[n:].any(), "a padded row (it sees nothing) is not zero"


def with_decode_kernel(metadata: AttentionMetadata, spans, kernel: str) -> AttentionMetadata:
    """A metadata like `metadata` (same sizes and device) for `spans`, attending with `kernel`."""
    twin = AttentionMetadata(metadata.max_batch_size, metadata.max_num_tokens,
                             metadata.max_blocks_per_seq, metadata.block_size, metadata.pad_slot,
                             metadata.device, decode_kernel=kernel)
    twin.prepare(spans, num_tokens=metadata.max_num_tokens, num_seqs=metadata.max_batch_size)
    return twin
