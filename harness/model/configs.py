"""Llama configurations the harness runs: a tiny one for CPU suites, a 1B-shaped one for GPU runs."""

from __future__ import annotations

from typing import Any

from transformers import LlamaConfig

TINY_LLAMA = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    tie_word_embeddings=False,
    # No special tokens: the harness generates a fixed number of tokens, and transformers' generate()
    # must not stop early on an EOS that the engine does not know about.
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


def tiny_llama_config(**overrides: Any) -> LlamaConfig:
    """The CPU-suite model: 2 layers, hidden 64, 4 query heads over 2 KV heads (GQA), vocab 512."""
    return LlamaConfig(**{**TINY_LLAMA, **overrides})


def llama_1b_config(**overrides: Any) -> LlamaConfig:
    """Shaped like Llama-3.2-1B (hidden 2048, 16 layers, 32 heads over 8 KV heads, vocab 128256,
    llama3 RoPE scaling); random weights, for GPU runs.

    Unlike the real model its embeddings are not tied to lm_head: with random weights a tied model
    puts the input token's own embedding into its last hidden state and predicts that token again
    (the tiny model did so at 99.6% of positions), so greedy output would repeat one token and a bug
    that feeds the wrong token would go unseen. Untying adds one 2048 x 128256 matrix; the compute per
    step is the same.

    The engine bounds its block tables by `EngineConfig.max_model_len`, so the 131072-position limit
    costs only the RoPE table.
    """
    config = dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
        },
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaConfig(**{**config, **overrides})
