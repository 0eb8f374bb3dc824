"""A tiny transformers Llama with seeded weights, its CPU greedy tokens to compare against, and
what the installed transformers' offloading cache does."""

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


def prefetch_waits_for_the_offload() -> bool:
    """Whether this transformers' offloading cache makes its prefetch stream wait for the default
    stream. transformers 5.17 did not: a layer's prefetch (an H2D copy on the prefetch stream) read
    the pinned copy its offload (a D2H copy on the default stream) was still writing, a race the
    tracking reports with both lines (on the CUDA wheel with the GPU hidden, 2026-12-06); 5.25
    waits."""
    import inspect

    from transformers.cache_utils import Cache

    return "prefetch_stream.wait_stream(" in inspect.getsource(Cache.update)
