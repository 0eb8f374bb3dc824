"""The tiny builder builds the architectures whose configs do not take the standard overrides as
they are: each one here was a build error of the builder (not of the model) until it learned the
config's way, and each must now build small and run a forward."""

from __future__ import annotations

import pytest
import torch

from harness.audit.tiny import MAX_PARAMS, build_tiny, causal_lm_architectures, tiny_config

# model_type -> what its config needs that the standard overrides do not give.
NEEDS = {
    "falcon": "head_dim is a read-only property",
    "prophetnet": "num_hidden_layers has a setter that refuses; encoder/decoder layer counts",
    "xlnet": "max_position_embeddings has a setter that refuses; d_head",
    "llama4": "a text model of a multimodal config",
    "qwen3_5": "a text model of a multimodal config",
    "deepseek_v3": "multi-head latent attention sizes",
    "deepseek_v2": "latent attention keeps one KV head per query head",
    "deepseek_v32": "indexer sizes and expert groups",
    "gpt_neo": "attention_types for 2 layers",
    "codegen": "rotary_dim within the head",
    "whisper": "decoder heads under their own name",
    "blenderbot": "decoder sizes under their own name",
    "dots1": "n_shared_experts defaults to None",
    "mamba2": "mixer heads that multiply to expand x hidden_size",
    "xmod": "a default language",
    "zaya": "a validator that refuses num_experts_per_tok=2",
    "hy_v4": "a full indexer layer first",
    "qwen3_5_moe": "a full-attention layer among the two",
    "kimi_linear": "a full-attention layer among the two",
}
AVAILABLE = {a.model_type: a for a in causal_lm_architectures()}


@pytest.mark.parametrize("model_type", sorted(NEEDS))
def test_builds_tiny_and_runs_a_forward(model_type):
    if model_type not in AVAILABLE:
        pytest.skip(f"this transformers has no {model_type}")
    model = build_tiny(AVAILABLE[model_type], torch.float32)
    assert sum(p.numel() for p in model.parameters()) <= MAX_PARAMS
    ids = torch.randint(3, 500, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape[:2] == (2, 6), NEEDS[model_type]
    assert torch.isfinite(logits).all()


def test_per_layer_lists_keep_a_layer_of_each_kind():
    # Qwen3.5's and Kimi-Linear's text layers are three linear-attention ones, then a full-attention
    # one: their first two would leave no attention layer; HY-V4's first layer is the full indexer
    # the others share, and stays first.
    assert tiny_config("qwen3_5").text_config.layer_types == ["linear_attention", "full_attention"]
    for model_type, key, kinds in (("kimi_linear", "layer_types", ["linear_attention", "full_attention"]),
                                   ("hy_v4", "indexer_types", ["full", "shared"])):
        if model_type in AVAILABLE:
            assert getattr(tiny_config(model_type), key) == kinds


def test_a_read_only_property_is_derived_not_forced():
    config = tiny_config("falcon")
    assert (config.hidden_size, config.num_attention_heads, config.head_dim) == (64, 4, 16)


def test_latent_attention_sizes_agree_with_one_another():
    # The rope part of the head sets the rotary width (head_dim), and the keys are per query head.
    config = tiny_config("deepseek_v3")
    assert (config.q_lora_rank, config.kv_lora_rank) == (32, 32)
    assert (config.qk_rope_head_dim, config.qk_nope_head_dim, config.v_head_dim) == (8, 8, 16)
    assert config.head_dim == config.qk_rope_head_dim
    assert config.num_key_value_heads == config.num_attention_heads == 4
