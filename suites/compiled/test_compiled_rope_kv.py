"""The compiled path with rope_kv_write="fused": dynamo traces `harness::rope_kv_write`, the backend
splits at it as at the attention ops (it writes the KV cache, a piece input), with no piece between
it and the attention op after it, and the step's logits and cache are the eager model's. On the
session's device and graph backend: the CPU and the emulated device run the op's torch
implementation, CUDA the Triton kernel through the same trace."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fixtures.fused_engines import fused_against_separate
from fixtures.models import TINY_ENGINE_CONFIG, mixed_requests
from harness.ops import AttentionMetadata, PagedKVCache
from harness.runtime import Engine
from harness.runtime.compiled.step import CompiledStep
from suites.compiled.test_compiled_decode_kernel import (LENGTHS, decode_batch, decode_metadata,
                                                        eager_twin)


def metadata(cache: PagedKVCache, spans, mode: str) -> AttentionMetadata:
    return decode_metadata(cache, spans, rope_kv_write=mode)


def test_compiled_step_splits_at_the_fused_op_and_matches_the_eager_model(device_reference_llama,
                                                                           device):
    model = device_reference_llama
    cache, spans, ids = decode_batch(model, device)
    eager_cache = eager_twin(cache)
    expected = model(ids, metadata(eager_cache, spans, "separate"), eager_cache)
    step = CompiledStep(model, None, rope_kv_write="fused")
    logits = step(ids, metadata(cache, spans, "fused"), cache)
    # Each layer splits twice (the fused op, the attention op) but adds one piece: the two ops
    # are adjacent, so no piece runs between them.
    assert step.piece_compiles == model.num_layers + 1
    torch.testing.assert_close(logits[:len(LENGTHS)], expected[:len(LENGTHS)], atol=0.05, rtol=0.02)
    real = metadata(cache, spans, "fused").slot_mapping[:len(LENGTHS)]
    torch.testing.assert_close(cache.tensor.flatten(2, 3)[:, :, real],
                               eager_cache.tensor.flatten(2, 3)[:, :, real], atol=0.05, rtol=0.02)


def test_a_compiled_step_of_another_rope_kv_write_is_refused(device_reference_llama, device):
    model = device_reference_llama
    cache, spans, ids = decode_batch(model, device)
    step = CompiledStep(model, None, rope_kv_write="fused")
    with pytest.raises(ValueError, match="built for rope_kv_write 'fused'"):
        step(ids, metadata(cache, spans, "separate"), cache)
    # The step's decode kernel is the torch path: the engine's too, so the refusal is the rope's.
    config = replace(TINY_ENGINE_CONFIG, compile="inductor", rope_kv_write="separate",
                     decode_kernel="torch")
    with pytest.raises(ValueError, match="rotates and stores K/V 'fused'"):
        Engine(model, config, compiled_step=step)


@pytest.mark.slow
def test_compiled_decode_graphs_with_the_fused_op_equal_the_separate_engine(device_reference_llama,
                                                                           graph_backend):
    requests = mixed_requests(logprobs=2, prompt_lens=(3, 12, 7, 20), max_new_tokens=(5, 9, 7, 11))
    config = replace(TINY_ENGINE_CONFIG, max_batch_size=4, decode_graph_sizes=(4, 2, 1),
                     compile="inductor")
    engine, comparison = fused_against_separate(device_reference_llama, config, "rope_kv_write",
                                                requests, graph_backend)
    assert engine.rope_kv_write.mode == "fused"
    assert comparison.ok, str(comparison)
