"""transformers' own greedy generation, recorded as `Generation`s: the oracle the engine is checked against.

Each request runs alone through `generate()` (batch 1, so no padding or attention mask is involved)
with do_sample=False, and the per-step logits it returns are turned into the same records the engine
produces: token, its logprob (log_softmax in fp32), the top-k pairs (by logit, ties to the lower id),
the logit scale (max |logit|), producer "transformers".
"""

from __future__ import annotations

from typing import Sequence

import torch

from harness.ranking import logits_to_steps
from harness.records import Generation, Request, Step

PRODUCER = "transformers"


@torch.no_grad()
def hf_greedy_generations(hf_model, requests: Sequence[Request]) -> list[Generation]:
    device = hf_model.lm_head.weight.device
    generations = []
    for request in requests:
        prompt = torch.tensor([list(request.prompt)], dtype=torch.int64, device=device)
        out = hf_model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                max_new_tokens=request.max_new_tokens, min_new_tokens=request.max_new_tokens,
                                output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        tokens = out.sequences[0, prompt.shape[1]:].tolist()
        logits = torch.stack(out.logits)[:, 0].float()  # [new tokens, vocab], raw (unprocessed) logits
        generations.append(Generation.from_steps(_steps(logits, tokens, request.logprobs)))
    return generations


def _steps(logits: torch.Tensor, tokens: list[int], k: int) -> list[Step]:
    # transformers' own token, which in a tie need not be the first of the ranking
    return logits_to_steps(logits, [k] * len(tokens), PRODUCER, tokens=tokens)
