"""The compiled path with decode_linear="fused": dynamo traces the decode GEMV ops through their
fakes and inductor keeps each as one opaque call inside its piece (they write nothing, so they are
no split points), and the step's logits are the eager model's. On the session's device and graph
backend: the CPU and the emulated device run the ops' torch implementation, CUDA the Triton
kernels through the same trace."""

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

GEMV_OPS = (torch.ops.harness.norm_gemv.default, torch.ops.harness.gemv_residual.default,
            torch.ops.harness.norm_gemv_silu_mul.default)


def metadata(cache: PagedKVCache, spans, mode: str) -> AttentionMetadata:
    return decode_metadata(cache, spans, decode_linear=mode)


def test_compiled_step_keeps_the_ops_opaque_and_matches_the_eager_model(device_reference_llama,
                                                                        device):
    model = device_reference_llama
    cache, spans, ids = decode_batch(model, device)
    eager_cache = eager_twin(cache)
    expected = model(ids, metadata(eager_cache, spans, "separate"), eager_cache)
    step = CompiledStep(model, None, decode_linear="fused")
    logits = step(ids, metadata(cache, spans, "fused"), cache)
    # The pieces are the separate path's (a split at each attention op only)...
    assert step.piece_compiles == model.num_layers + 1
    # ... and inside them each op is one call: qkv in every piece before an attention op, o_proj,
    # gate_up and down after it; lm_head (the last piece) on the torch ops.
    calls = [node.target for piece in step.backend.pieces for node in piece.graph.nodes
             if node.op == "call_function" and node.target in GEMV_OPS]
    layers = model.num_layers
    assert calls.count(GEMV_OPS[0]) == layers
    assert calls.count(GEMV_OPS[1]) == 2 * layers and calls.count(GEMV_OPS[2]) == layers
    torch.testing.assert_close(logits[:len(LENGTHS)], expected[:len(LENGTHS)], atol=0.125,
                               rtol=0.02)  # inductor's and eager's bf16 orders: 0.094 on the H200


def test_a_compiled_step_of_another_decode_linear_is_refused(device_reference_llama, device):
    model = device_reference_llama
    cache, spans, ids = decode_batch(model, device)
    step = CompiledStep(model, None, decode_linear="fused")
    with pytest.raises(ValueError, match="built for decode_linear 'fused'"):
        step(ids, metadata(cache, spans, "separate"), cache)
    config = replace(TINY_ENGINE_CONFIG, compile="inductor", decode_linear="separate",
                     decode_kernel="torch", rope_kv_write="separate")
    with pytest.raises(ValueError, match="runs its linear layers 'fused'"):
        Engine(model, config, compiled_step=step)


@pytest.mark.slow
def test_compiled_decode_graphs_with_the_fused_ops_equal_the_separate_engine(device_reference_llama,
                                                                            graph_backend):
    requests = mixed_requests(logprobs=2, prompt_lens=(3, 12, 7, 20), max_new_tokens=(5, 9, 7, 11))
    config = replace(TINY_ENGINE_CONFIG, max_batch_size=4, decode_graph_sizes=(4, 2, 1),
                     compile="inductor")
    engine, comparison = fused_against_separate(device_reference_llama, config, "decode_linear",
                                                requests, graph_backend)
    assert engine.decode_linear.mode == "fused"
    assert comparison.ok, str(comparison)
