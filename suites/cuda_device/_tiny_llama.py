"""A tiny transformers Llama with seeded weights, and its CPU greedy tokens to compare against."""

from __future__ import annotations

import torch


def tiny_llama_with_cpu_tokens(new_tokens: int = 8):
    """(model on the host, prompt on the host, the CPU's greedy tokens for the prompt)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    prompt = torch.tensor([[1, 5, 7, 9]])
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False)
    return model, prompt, expected
