"""A runtime of "your own": greedy decoding of a transformers causal LM, one request at a time, with
a static KV cache and, optionally, its decode step captured once into a graph and replayed.

It is small on purpose. What makes it testable by the harness is only this: `generate(requests)`
returns one `harness.records.Generation` per request, whose steps say the token, its logprob, the
top-k pairs, the logit scale and who produced the step.
"""

from __future__ import annotations

import torch
from transformers import StaticCache

from harness.ranking import logits_to_steps
from harness.records import Generation, Request, Step


class MyRuntime:
    def __init__(self, model, backend=None, max_len: int = 64) -> None:
        self.model = model
        self.backend = backend  # a harness GraphBackend, or None for eager
        self.device = model.lm_head.weight.device
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        # Static inputs: the decode step reads these, so a graph can be replayed after copying into them.
        self.token = torch.zeros(1, 1, dtype=torch.int64, device=self.device)
        self.position = torch.zeros(1, 1, dtype=torch.int64, device=self.device)
        self.graph = None

    def decode_step(self) -> torch.Tensor:
        with torch.inference_mode():
            return self.model(input_ids=self.token, position_ids=self.position, past_key_values=self.cache,
                              use_cache=True).logits[:, -1]

    def set_inputs(self, token: int, position: int) -> None:
        """Copy the next step's inputs into the static buffers (never rebind them: a graph reads these)."""
        self.token.fill_(token)
        self.position.fill_(position)

    def generate(self, requests: list[Request]) -> list[Generation]:
        return [self._one(request) for request in requests]

    @torch.inference_mode()
    def _one(self, request: Request) -> Generation:
        if self.backend is not None and self.graph is None:
            self._capture()
        self.cache.reset()
        prompt = torch.tensor([request.prompt], device=self.device)
        logits = self.model(input_ids=prompt, past_key_values=self.cache, use_cache=True).logits[:, -1]
        steps = [self._step(logits, request.logprobs, "eager")]
        for t in range(1, request.max_new_tokens):
            self.set_inputs(steps[-1].token, len(request.prompt) + t - 1)
            if self.graph is not None:
                self.graph.replay()
                steps.append(self._step(self.graph.output, request.logprobs, "decode[bs=1,greedy]"))
            else:
                steps.append(self._step(self.decode_step(), request.logprobs, "eager"))
        return Generation.from_steps(steps)

    def _capture(self) -> None:
        # The cache allocates its tensors on first use: do that before capture, then warm up and capture.
        self.model(input_ids=self.token, position_ids=self.position, past_key_values=self.cache, use_cache=True)
        self.position.fill_(1)
        self.decode_step()
        self.cache.reset()
        self.graph = self.backend.capture(self.decode_step)

    @staticmethod
    def _step(logits: torch.Tensor, k: int, producer: str) -> Step:
        # The harness's own reading of logits: greedy token, fp32 log_softmax, top-k, max |logit|.
        return logits_to_steps(logits[:1], [k], producer)[0]


def make_decode_step():
    """For `harness lint --factory my_runtime:make_decode_step`: build a runtime on the seeded tiny
    Llama and hand back its decode step."""
    from harness.model import tiny_llama

    runtime = MyRuntime(tiny_llama(seed=0))
    runtime.decode_step()  # the warmup call a capture follows: lazy set-up is no capture hazard
    return runtime.decode_step
