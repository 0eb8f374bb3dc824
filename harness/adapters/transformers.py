"""A runtime over any transformers causal LM with a `StaticCache`, in eager or graph mode.

- Batching. A static cache has one write position for all its rows (transformers 5 keeps it in
  `layer.cumulative_length`, a device tensor advanced in place), so a batch holds requests whose
  prompts have the same length; requests of other lengths go to later batches, in order. No
  attention mask is ever needed, so no padding mask reaches transformers' mask code.
- Padding. A batch of n requests runs at the smallest batch size >= n that the runtime has: in graph
  mode a captured size, in eager mode n itself. Dummy rows repeat the batch's first prompt and their
  results are dropped; rows whose request has finished keep running until the batch is done.
- Steps. The prompt runs eagerly (prefill); every decode step reads its inputs from static buffers
  (`input_ids`, `position_ids`, [size, 1]) that are copied into, never rebound, and the cache
  advances in place. In graph mode that step is captured once per batch size, at warmup, on dummy
  inputs (a one-token prefill), and every later decode step of that size is a replay; the cache is
  reset in place between batches, so the graph keeps its addresses.
- Records. Greedy with ties to the lowest token id, top-k logprobs, logit scale (max |logit|) from
  `harness.ranking.rank_logits`, as the reference engine ranks; `producer` is "eager" for eager
  steps and prefills, the graph key's text (`decode[bs=4,greedy]`: logits out, ranked on the host, as the engine's
  "greedy" graphs) for replays.

What this does not hide: host state a model keeps in Python (a sliding-window layer's fill level)
is frozen into the graph at capture, as on a GPU. That is what the audit looks for.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

import torch

from harness.graphs.base import CapturedGraph, GraphBackend
from harness.ranking import rank_logits, steps_from_ranked
from harness.records import EAGER, BadRequestError, Generation, Request, RequestProblem, Step


@dataclass(frozen=True)
class DecodeKey:
    """What one captured decode step is specialised to."""

    batch_size: int

    def __str__(self) -> str:
        return f"decode[bs={self.batch_size},greedy]"


@dataclass(frozen=True)
class AdapterStats:
    """What the runtime did so far: captures and replays per graph key (read-only mappings, as in
    the engine's `EngineStats`), eager decode steps, prefills."""

    captures: Mapping[str, int] = field(default_factory=dict)
    replays: Mapping[str, int] = field(default_factory=dict)
    eager_steps: int = 0
    prefills: int = 0


class _Slot:
    """One batch size's static cache, input buffers and (in graph mode) captured decode step."""

    def __init__(self, cache: Any, batch_size: int, device: torch.device) -> None:
        self.cache = cache
        self.key = DecodeKey(batch_size)
        self.input_ids = torch.zeros(batch_size, 1, dtype=torch.int64, device=device)
        self.position_ids = torch.zeros(batch_size, 1, dtype=torch.int64, device=device)
        self.graph: CapturedGraph | None = None


class TransformersRuntime:
    """`generate(requests) -> list[Generation]` over `model` (a transformers causal LM).

    `backend` and `graph_sizes` select graph mode: every decode step runs as a replay of the step
    captured for the smallest size that fits the batch. Without them the runtime is eager. A batch
    larger than the largest size is split. `max_cache_len` bounds prompt + new tokens per request.
    """

    def __init__(self, model: Any, *, backend: GraphBackend | None = None,
                 graph_sizes: Sequence[int] = (), max_cache_len: int = 128,
                 max_batch_size: int = 8) -> None:
        sizes = tuple(sorted(set(int(s) for s in graph_sizes)))
        if any(s < 1 for s in sizes):
            raise ValueError(f"graph_sizes must be positive, got {list(graph_sizes)}")
        if (backend is None) != (not sizes):
            raise ValueError("graph mode needs both a backend and graph_sizes; eager mode neither "
                             f"(got backend={backend!r}, graph_sizes={list(graph_sizes)})")
        if max_cache_len < 2:
            raise ValueError(f"max_cache_len must be at least 2, got {max_cache_len}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.model = model
        self.backend = backend
        self.graph_sizes = sizes
        self.max_cache_len = max_cache_len
        self.max_batch_size = sizes[-1] if sizes else max_batch_size
        self.device = next(model.parameters()).device
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self._counts: Counter[str] = Counter()  # "capture:<key>", "replay:<key>", "eager", "prefill"
        self._slots: dict[int, _Slot] = {}

    @property
    def stats(self) -> AdapterStats:
        """A snapshot: it does not change as the runtime goes on."""
        def per_key(prefix: str) -> Mapping[str, int]:
            return MappingProxyType({k[len(prefix):]: n for k, n in self._counts.items() if k.startswith(prefix)})

        return AdapterStats(captures=per_key("capture:"), replays=per_key("replay:"),
                            eager_steps=self._counts["eager"], prefills=self._counts["prefill"])

    @property
    def mode(self) -> str:
        return "graph" if self.backend is not None else EAGER

    # --- the protocol ------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(self, requests: Sequence[Request]) -> list[Generation]:
        """One Generation per request, in order (the `harness.records.Runtime` contract): the valid
        requests run, then `BadRequestError` names each request over a limit (index, value, limit)."""
        problems = [RequestProblem(i, reason) for i, r in enumerate(requests)
                    if (reason := self._problem(r)) is not None]
        bad = {p.index for p in problems}
        results: list[Generation | None] = [None] * len(requests)
        for batch in self._batches([i for i in range(len(requests)) if i not in bad], requests):
            steps = self._run_batch([requests[i] for i in batch])
            for i, request_steps in zip(batch, steps):
                results[i] = Generation.from_steps(request_steps)
        if problems:
            raise BadRequestError(problems, results)
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def capture(self, batch_size: int) -> DecodeKey:
        """Capture the decode step for `batch_size` now (graph mode); it is otherwise captured when
        the first batch of that size needs it."""
        return self._slot(self._size_for(batch_size)).key

    @torch.inference_mode()
    def decode_step(self, batch_size: int) -> Callable[[], torch.Tensor]:
        """The eager decode step for `batch_size` over its static buffers and cache, one token
        cached, as graph mode captures it: what the capture lint runs."""
        slot = self._slot(self._size_for(batch_size))
        slot.cache.reset()
        self._forward(slot.input_ids, slot.position_ids.zero_(), slot.cache)
        slot.position_ids.fill_(1)
        runtime = self

        def step() -> torch.Tensor:
            with torch.inference_mode():
                return runtime._decode(slot)

        return step

    # --- batching ----------------------------------------------------------------------------

    def _problem(self, request: Request) -> str | None:
        """Why `request` cannot run here (the value and the limit), or None."""
        if not request.prompt:
            return "empty prompt (at least 1 token needed)"
        if request.max_new_tokens < 1:
            return f"max_new_tokens {request.max_new_tokens!r} must be an integer >= 1"
        total = len(request.prompt) + request.max_new_tokens
        if total > self.max_cache_len:
            return (f"prompt length {len(request.prompt)} + max_new_tokens {request.max_new_tokens} = "
                    f"{total} exceeds max_cache_len {self.max_cache_len}")
        bad = [t for t in request.prompt if not 0 <= t < self.vocab_size]
        if bad:
            return f"prompt tokens {bad[:5]} outside the vocabulary [0, {self.vocab_size})"
        if not 0 <= request.logprobs <= self.vocab_size:
            return f"logprobs {request.logprobs!r} must lie in [0, vocab size {self.vocab_size}]"
        return None

    def _batches(self, indices: Sequence[int], requests: Sequence[Request]) -> list[list[int]]:
        by_length: dict[int, list[int]] = {}
        for index in indices:
            by_length.setdefault(len(requests[index].prompt), []).append(index)
        batches = []
        for indices in by_length.values():
            for start in range(0, len(indices), self.max_batch_size):
                batches.append(indices[start:start + self.max_batch_size])
        return batches

    def _size_for(self, n: int) -> int:
        if not self.graph_sizes:
            return n
        for size in self.graph_sizes:
            if size >= n:
                return size
        raise ValueError(f"batch of {n} is larger than the largest graph size {self.graph_sizes[-1]}")

    # --- running a batch ---------------------------------------------------------------------

    def _run_batch(self, batch: list[Request]) -> list[list[Step]]:
        slot = self._slot(self._size_for(len(batch)))
        size = slot.key.batch_size
        prompts = [list(r.prompt) for r in batch] + [list(batch[0].prompt)] * (size - len(batch))
        prompt_len = len(prompts[0])
        slot.cache.reset()
        prompt = torch.tensor(prompts, dtype=torch.int64, device=self.device)
        positions = torch.arange(prompt_len, device=self.device).expand(size, -1)
        logits = self._forward(prompt, positions, slot.cache)[:, -1]
        self._counts["prefill"] += 1
        steps: list[list[Step]] = [[] for _ in batch]
        widths = [r.logprobs for r in batch]
        tokens = self._record(logits, widths, steps, EAGER)
        for t in range(1, max(r.max_new_tokens for r in batch)):
            self._set_inputs(slot, tokens, prompt_len + t - 1)
            if slot.graph is not None:
                slot.graph.replay()
                logits, producer = slot.graph.output, str(slot.key)
                self._counts[f"replay:{producer}"] += 1
            else:
                logits, producer = self._decode(slot), EAGER
                self._counts["eager"] += 1
            tokens = self._record(logits, widths, steps, producer)
        return [s[:r.max_new_tokens] for s, r in zip(steps, batch)]

    def _set_inputs(self, slot: _Slot, tokens: list[int], position: int) -> None:
        """Copy the next step's inputs into the slot's static buffers (a graph reads only those)."""
        slot.input_ids.copy_(torch.tensor(tokens, device=self.device)[:, None])
        slot.position_ids.fill_(position)

    def _record(self, logits: torch.Tensor, widths: list[int], steps: list[list[Step]],
                producer: str) -> list[int]:
        """Append each real row's step; return every row's greedy token (dummy rows included)."""
        ranked = rank_logits(logits, max(widths))
        for row, step in enumerate(steps_from_ranked(ranked, widths, producer)):
            steps[row].append(step)
        return ranked.order[:, 0].tolist()

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache: Any) -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self.model(input_ids=input_ids, position_ids=position_ids, past_key_values=cache,
                              use_cache=True).logits

    def _decode(self, slot: _Slot) -> torch.Tensor:
        return self._forward(slot.input_ids, slot.position_ids, slot.cache)[:, -1]

    # --- slots and capture -------------------------------------------------------------------

    def _slot(self, size: int) -> _Slot:
        slot = self._slots.get(size)
        if slot is None:
            slot = self._slots[size] = self._new_slot(size)
        return slot

    def _new_slot(self, size: int) -> _Slot:
        from transformers import StaticCache

        config = self.model.config
        cache = StaticCache(config=config, max_cache_len=self.max_cache_len)
        slot = _Slot(cache, size, self.device)
        # A one-token prefill allocates the cache's tensors (transformers does so lazily, on first
        # use); they must exist before capture, or the graph would own and re-zero them.
        self._forward(slot.input_ids, slot.position_ids, cache)
        if self.backend is not None:
            slot.position_ids.fill_(1)
            self._decode(slot)  # warmup: kernels and workspaces settle before capture
            cache.reset()
            self._forward(slot.input_ids, slot.position_ids.zero_(), cache)
            slot.position_ids.fill_(1)
            slot.graph = self.backend.capture(lambda: self._decode(slot))
            self._counts[f"capture:{slot.key}"] += 1
        cache.reset()
        return slot
