"""Tiny seeded transformers decoders (no download) and one decode step over a StaticCache, for the
model-shaped contract cases: what a runtime captures, on whichever device the backend uses."""

from __future__ import annotations

import warnings
from typing import Callable

import torch

POSITION = 3


def tiny_causal_lm(family: str, device: torch.device, dtype: torch.dtype = torch.float32, *,
                   seed: int = 0, **overrides):
    """A 2-layer decoder of a transformers family ("gpt2", "llama", "gpt_neox"), seeded."""
    import transformers

    common = dict(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=1)
    if family == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=64, **common)
        model_class = transformers.GPT2LMHeadModel
    elif family == "llama":
        config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=2, num_key_value_heads=1,
                                          max_position_embeddings=64, **common)
        model_class = transformers.LlamaForCausalLM
    elif family == "gpt_neox":
        config = transformers.GPTNeoXConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=2, max_position_embeddings=64, **common)
        model_class = transformers.GPTNeoXForCausalLM
    else:
        raise ValueError(f"unknown family {family!r}; expected gpt2, llama or gpt_neox")
    for name, value in overrides.items():
        setattr(config, name, value)
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model_class(config)
    return model.to(device=device, dtype=dtype).eval()


def decode_step(model, batch: int = 2) -> Callable[[], torch.Tensor]:
    """One decode step at a fixed position over a fresh StaticCache: the cache is allocated (by a
    first call) and zeroed before this returns, and each call starts from the same cache length."""
    from transformers import StaticCache

    device = next(model.parameters()).device
    cache = StaticCache(config=model.config, max_cache_len=16)
    kwargs = dict(input_ids=(torch.arange(batch, device=device) * 7 % 60 + 2)[:, None],
                  position_ids=torch.full((batch, 1), POSITION, device=device),
                  cache_position=torch.tensor([POSITION], device=device),
                  past_key_values=cache, use_cache=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(**kwargs)
    for layer in cache.layers:
        layer.keys.zero_()
        layer.values.zero_()

    def step() -> torch.Tensor:
        for layer in cache.layers:
            if hasattr(layer, "cumulative_length"):
                layer.cumulative_length.fill_(POSITION)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # transformers' renamed arguments
            return model(**kwargs).logits

    return step


def captured_and_eager(backend, build: Callable[[], Callable[[], torch.Tensor]]):
    """(replayed output, eager output) of two identical steps, one captured and replayed."""
    graphed, eager = build(), build()
    graph = backend.capture(graphed)
    graph.replay()
    backend.synchronize()
    return graph.output, eager()
