"""Seeded random Llama models built without any download.

Why not transformers' own init: it draws N(0, 0.02) for every weight, which for a 64-wide model gives
logits of about 0.2 in magnitude, so greedy decoding would be decided by rounding noise. Instead:

- lm_head rows have std LOGIT_STD / sqrt(hidden): hidden states reach lm_head RMS-normalised, so
  logits have std about 4 and max |logit| over 512 tokens of about 10-16 (a BF16 step there is 1/16).
  The top two logits are then a median 13 BF16 steps apart; about 10% of steps are near ties
  (within the comparator's 2 steps), and those the comparator tolerates.
- Embeddings (when untied) have unit variance, so the residual stream starts at O(1).
- Other projections are N(0, 1 / fan_in), and the two that write into the residual stream (o_proj,
  down_proj) are further scaled by 1 / sqrt(2 * layers), as GPT-2 does. Without that, 1-ulp
  differences between two correct bf16 attention kernels were amplified to 2.5 BF16 steps of logit
  in the tiny model; with it, under 2. Attention still matters: dropping the first prompt token moves
  the last logits by a median 25 BF16 steps.
- RMSNorm weights are jittered around 1 (see NORM_JITTER).
- Tied embeddings (`tie_word_embeddings=True`) load and run, but a random tied model mostly predicts
  its input token again (the token's own embedding dominates its last hidden state), so the suites'
  generation models are untied.

All draws come from a private `torch.Generator` on the CPU, so the global RNG is untouched and the same
seed gives the same weights on every device.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from harness.model.configs import tiny_llama_config

LOGIT_STD = 4.0
# RMSNorm weights start at 1 in transformers; jittering them makes a norm weight that is not loaded
# (or loaded into the wrong layer) change the logits, so the oracle test can see it.
NORM_JITTER = 0.1


def random_llama(config: LlamaConfig, seed: int = 0, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str = "cpu") -> LlamaForCausalLM:
    """A `LlamaForCausalLM` of `config` with seeded weights (see the module docstring for the scales)."""
    # transformers initialises with the global RNG while constructing; fork it so the caller's
    # RNG state is the same afterwards.
    with torch.random.fork_rng(devices=[]):
        model = LlamaForCausalLM(config)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # tied weights appear once
            param.copy_(_draw(name, param, config, generator))
    return model.to(device=device, dtype=dtype).eval()


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu",
               **overrides: Any) -> LlamaForCausalLM:
    """The seeded tiny Llama of the CPU suites; `overrides` go to its `LlamaConfig`."""
    return random_llama(tiny_llama_config(**overrides), seed=seed, dtype=dtype, device=device)


def _draw(name: str, param: torch.Tensor, config: LlamaConfig, generator: torch.Generator) -> torch.Tensor:
    shape = tuple(param.shape)
    if name.endswith("norm.weight"):
        return 1.0 + NORM_JITTER * torch.randn(shape, generator=generator)
    if name.endswith(".bias"):
        return torch.zeros(shape)
    if "lm_head" in name or ("embed_tokens" in name and config.tie_word_embeddings):
        return (LOGIT_STD / math.sqrt(config.hidden_size)) * torch.randn(shape, generator=generator)
    if "embed_tokens" in name:
        return torch.randn(shape, generator=generator)
    std = 1.0 / math.sqrt(shape[-1])
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        std /= math.sqrt(2 * config.num_hidden_layers)
    return std * torch.randn(shape, generator=generator)
