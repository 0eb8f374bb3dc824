"""The compiled step with decode_kernel="triton": dynamo traces `harness::paged_decode_attention`,
the backend splits at it as at the other attention ops, and the step's logits are the eager
model's, on the session's device. On the CPU and the emulated device the op runs its torch-ops
implementation; on CUDA the same trace launches the Triton kernel."""

from __future__ import annotations

import pytest
import torch

from harness.ops import AttentionMetadata, PagedKVCache, SequenceSpan
from harness.runtime.compiled.step import CompiledStep

LENGTHS = (9, 23, 2)  # decode sequences: cached prefix + the new token
BLOCK = 4


def decode_batch(model, device) -> tuple[PagedKVCache, list[SequenceSpan], torch.Tensor]:
    """A cache of random K/V (every layer) and decode spans over scattered blocks."""
    gen = torch.Generator().manual_seed(0)
    blocks_per_seq = -(-max(LENGTHS) // BLOCK)
    cache = PagedKVCache(model.num_layers, len(LENGTHS) * blocks_per_seq + 2, BLOCK,
                         model.num_kv_heads, model.head_dim, model.dtype, device)
    cache.tensor.copy_(torch.randn(cache.tensor.shape, generator=gen))
    blocks = cache.allocator.allocate(cache.num_blocks)[::-1]
    spans = [SequenceSpan(n, 1, blocks[i * blocks_per_seq:(i + 1) * blocks_per_seq])
             for i, n in enumerate(LENGTHS)]
    return cache, spans, torch.tensor([5, 17, 3, 0], dtype=torch.int64, device=device)


def eager_twin(cache: PagedKVCache) -> PagedKVCache:
    """A second cache holding the same K/V, for the eager model to write beside the compiled one."""
    twin = PagedKVCache(cache.num_layers, cache.num_blocks, cache.block_size, cache.num_kv_heads,
                        cache.head_dim, cache.dtype, cache.device)
    twin.tensor.copy_(cache.tensor)
    return twin


def decode_metadata(cache: PagedKVCache, spans, **choices: str) -> AttentionMetadata:
    """The batch's metadata, with the kernel choices named (decode_kernel=, rope_kv_write=, ...)."""
    md = AttentionMetadata(4, 4, -(-max(LENGTHS) // BLOCK), BLOCK, cache.pad_slot, cache.device,
                           **choices)
    md.prepare(spans, num_tokens=4, num_seqs=4)  # one padded row and sequence
    return md


def metadata(cache: PagedKVCache, spans, kernel: str) -> AttentionMetadata:
    return decode_metadata(cache, spans, decode_kernel=kernel)


def test_compiled_step_splits_at_the_decode_op_and_matches_the_eager_model(device_reference_llama,
                                                                            device):
    reference_llama = device_reference_llama
    cache, spans, ids = decode_batch(reference_llama, device)
    eager_cache = eager_twin(cache)
    expected = reference_llama(ids, metadata(eager_cache, spans, "torch"), eager_cache)
    triton_md = metadata(cache, spans, "triton")
    assert triton_md.uses_decode_kernel
    step = CompiledStep(reference_llama, None, "triton")
    before = cache.tensor.clone()
    logits = step(ids, triton_md, cache)
    # One piece per layer boundary: the decode op is a split point, never inside a piece.
    assert step.piece_compiles == reference_llama.num_layers + 1
    torch.testing.assert_close(logits[:len(LENGTHS)], expected[:len(LENGTHS)], atol=0.05, rtol=0.02)
    # The new tokens' K/V reached the cache as the eager model wrote them (inductor's fused RoPE
    # rounds a little differently).
    torch.testing.assert_close(cache.tensor, eager_cache.tensor, atol=0.05, rtol=0.02)
    slots = triton_md.slot_mapping[:len(LENGTHS)]
    new_kv = cache.tensor.flatten(2, 3)[:, :, slots]
    assert not torch.equal(new_kv, before.flatten(2, 3)[:, :, slots]), "no new K/V was written"


@pytest.mark.parametrize("option, asked", [("decode_kernel", "triton"), ("rope_kv_write", "fused"),
                                           ("decode_linear", "fused")])
def test_metadata_of_another_choice_is_refused_naming_it(reference_llama, option, asked):
    cache, spans, ids = decode_batch(reference_llama, torch.device("cpu"))
    step = CompiledStep(reference_llama, None)
    built = {"decode_kernel": "torch"}.get(option, "separate")
    with pytest.raises(ValueError, match=rf"^compiled step: built for {option} '{built}', the "
                                         rf"metadata asks for '{asked}'; build both from one "
                                         rf"EngineConfig$"):
        step(ids, decode_metadata(cache, spans, **{option: asked}), cache)
