"""The engine: requests in, greedy generations with top-k logprobs out.

A step is: schedule a batch (scheduler.py), run the model on it (`_forward`), pick tokens and
logprobs (sampling.py), record the step. `_forward(batch)` is the seam where graph dispatch plugs in:
it prepares the metadata for the batch, at the padded shape it chooses, and returns the logits of
the batch's real sequences with the name of whatever produced them ("eager" here, a graph key later).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence as Seq

import torch

from harness.graphs import get_backend
from harness.graphs.base import GraphBackend
from harness.ops.kv_cache import PagedKVCache
from harness.ops.metadata import AttentionMetadata
from harness.ops.sizing import cdiv
from harness.records import EAGER, Generation, Request, Step
from harness.runtime.config import EngineConfig
from harness.runtime import dispatch
from harness.runtime.dispatch import DECODE, EAGER_ROUTE, PIECEWISE
from harness.runtime.piecewise_model import PiecewiseGraphs, bucket_key
from harness.runtime.sampling import greedy_with_logprobs
from harness.runtime.scheduler import ScheduledBatch, Scheduler, Sequence
from harness.runtime.stats import BatchRecord, EngineStats, StatsRecorder
from harness.runtime.validation import BadRequestError, RequestLimits, RequestProblem, check_request


@dataclass(frozen=True)
class ForwardResult:
    logits: torch.Tensor  # [batch.num_seqs, vocab], float32
    producer: str


class Engine:
    """Greedy generation on a `ReferenceLlama` with a paged KV cache.

    - Greedy: the argmax of each step's logits, ties to the lowest token id. There is no EOS: every
      request generates exactly `max_new_tokens` tokens, so runs compare step for step.
    - Batching (scheduler.py): all requests are admitted on the first step when the limits allow;
      decode batches then shrink as requests finish, and a request's KV blocks are freed the step it
      finishes.
    - `backend` (a GraphBackend) is kept for the graph machinery; eager mode never uses it.
    """

    def __init__(self, model, config: EngineConfig | None = None, backend: GraphBackend | None = None) -> None:
        self.model = model
        self.config = config = config or EngineConfig()
        self.backend = backend
        self.device = model.device
        if config.device is not None and not _same_device(torch.device(config.device), model.device):
            raise ValueError(f"model is on {model.device}, EngineConfig.device is {config.device}")
        # K/V are stored as the model computes them: a cache dtype other than the model's is refused.
        dtype = config.dtype or model.dtype
        if dtype != model.dtype:
            raise ValueError(f"EngineConfig.dtype {dtype} must match the model dtype {model.dtype}")
        _refuse_graph_options(config)
        if config.max_model_len is not None and config.max_model_len > model.max_positions:
            raise ValueError(f"EngineConfig.max_model_len {config.max_model_len} exceeds the model's "
                             f"max_position_embeddings {model.max_positions}")
        self.max_model_len = config.max_model_len or model.max_positions
        blocks_per_seq = cdiv(self.max_model_len, config.block_size)
        num_blocks = config.num_blocks or config.max_batch_size * blocks_per_seq
        self.kv_cache = PagedKVCache(model.num_layers, num_blocks, config.block_size, model.num_kv_heads,
                                     model.head_dim, dtype=dtype, device=self.device)
        self.metadata = AttentionMetadata(config.max_batch_size, config.max_num_tokens, blocks_per_seq,
                                          config.block_size, self.kv_cache.pad_slot, device=self.device)
        # Token ids live in one preallocated buffer, like the metadata, so a graph can read them.
        self.input_ids = torch.zeros(config.max_num_tokens, dtype=torch.int64, device=self.device)
        self.limits = RequestLimits(vocab_size=model.vocab_size, max_model_len=self.max_model_len,
                                    max_prompt_len=config.max_num_tokens, num_blocks=num_blocks,
                                    block_size=config.block_size)
        self._stats = StatsRecorder()
        # Decode graphs are connected by the decode-graph machinery; None routes decodes eagerly.
        self.decode_graphs = None
        self.piecewise = self._build_piecewise(config, backend)

    def _build_piecewise(self, config: EngineConfig, backend: GraphBackend | None) -> PiecewiseGraphs | None:
        if not config.piecewise_buckets:
            return None
        if backend is None:
            self.backend = backend = get_backend("cuda" if self.device.type == "cuda" else "emulated",
                                                 device=self.device)
        piecewise = PiecewiseGraphs(self.model, self.kv_cache, self.metadata, self.input_ids,
                                    config.piecewise_buckets, backend, self._stats)
        piecewise.capture()
        return piecewise

    @property
    def stats(self) -> EngineStats:
        return self._stats.snapshot()

    @property
    def num_free_blocks(self) -> int:
        return self.kv_cache.allocator.num_free

    def generate(self, requests: Seq[Request]) -> list[Generation]:
        """One Generation per request, in order.

        Requests that break a limit (empty prompt, prompt + max_new_tokens over max_model_len,
        logprobs over the vocabulary, max_new_tokens < 1, ...) do not stop the others: the valid ones
        run, then `BadRequestError` (a ValueError) is raised, naming each bad request's index and
        limit and carrying `.generations` (None at the bad positions).
        """
        problems = []
        for index, request in enumerate(requests):
            reason = check_request(request, self.limits)
            if reason is not None:
                problems.append(RequestProblem(index, reason))
        bad = {p.index for p in problems}
        sequences = [Sequence(i, r) for i, r in enumerate(requests) if i not in bad]
        self._run(sequences)
        generations: list[Generation | None] = [None] * len(requests)
        for sequence in sequences:
            generations[sequence.index] = Generation.from_steps(sequence.steps)
        if problems:
            raise BadRequestError(problems, generations)
        return generations  # type: ignore[return-value]

    def _run(self, sequences: list[Sequence]) -> None:
        scheduler = Scheduler(self.kv_cache.allocator, max_batch_size=self.config.max_batch_size,
                              max_num_tokens=self.config.max_num_tokens, block_size=self.config.block_size)
        for sequence in sequences:
            scheduler.add(sequence)
        try:
            self._step_until_done(scheduler)
        finally:
            # After an error mid-run, unfinished sequences still hold blocks: give them back.
            for sequence in sequences:
                if sequence.blocks:
                    self.kv_cache.allocator.free(sequence.blocks)
                    sequence.blocks = []

    def _step_until_done(self, scheduler: Scheduler) -> None:
        while not scheduler.done:
            batch = scheduler.schedule()
            result = self._forward(batch)
            rows = greedy_with_logprobs(result.logits, [s.request.logprobs for s in batch.sequences])
            for sequence, row in zip(batch.sequences, rows):
                sequence.steps.append(Step(token=row.token, logprob=row.logprob, top=row.top,
                                           logit_scale=row.logit_scale, producer=result.producer))
                sequence.tokens.append(row.token)
            scheduler.finish_step(batch)
            self._stats.record_batch(BatchRecord(kind=batch.kind, num_seqs=batch.num_seqs,
                                                 num_tokens=batch.num_tokens, producer=result.producer,
                                                 free_blocks=self.num_free_blocks))

    def _prepare(self, batch: ScheduledBatch, *, num_tokens: int | None = None,
                 num_seqs: int | None = None) -> None:
        """Copy the batch into the metadata and input buffers, padded to the given shape."""
        self.metadata.prepare(list(batch.spans), num_tokens=num_tokens, num_seqs=num_seqs)
        ids = batch.input_ids
        self.input_ids[: len(ids)].copy_(torch.tensor(ids, dtype=torch.int64))
        # Padded token rows read token 0; their K/V goes to the pad sink and their logits are dropped.
        self.input_ids[len(ids): self.metadata.num_tokens].zero_()

    def _forward(self, batch: ScheduledBatch) -> ForwardResult:
        buckets = self.piecewise.buckets if self.piecewise is not None else ()
        chosen = dispatch.route(batch.kind, batch.num_seqs, batch.num_tokens,
                                decode_graphs=self.decode_graphs, buckets=buckets)
        if chosen.kind == PIECEWISE:
            return self._forward_piecewise(batch, chosen.size)
        if chosen.kind == DECODE:
            return self._forward_decode_graph(batch, chosen.size)
        if chosen.kind == EAGER_ROUTE and (self.piecewise is not None or self.decode_graphs is not None):
            self._stats.fallbacks[chosen.reason] += 1
        self._prepare(batch)
        logits = self.model(self.input_ids, self.metadata, self.kv_cache)
        return ForwardResult(logits=logits[: batch.num_seqs], producer=EAGER)

    def _forward_decode_graph(self, batch: ScheduledBatch, size: int) -> ForwardResult:
        # Merge point with the decode-graph machinery: replay its graph of `size` for this batch.
        raise NotImplementedError(f"decode graph of size {size} chosen for a batch of {batch.num_seqs}, "
                                  "but this engine has no decode-graph runner connected")

    def _forward_piecewise(self, batch: ScheduledBatch, bucket: int) -> ForwardResult:
        self._prepare(batch, num_tokens=bucket)
        logits = self.piecewise.run(batch.num_seqs, bucket)
        return ForwardResult(logits=logits, producer=bucket_key(bucket))


def _refuse_graph_options(config: EngineConfig) -> None:
    # piecewise_buckets is honoured (piecewise_model.py); the decode-graph options are not yet.
    asked = {name: getattr(config, name) for name in ("decode_graph_sizes", "single_pass_capture")
             if getattr(config, name)}
    if asked:
        raise ValueError(f"EngineConfig asks for graphs ({', '.join(f'{k}={v!r}' for k, v in asked.items())}), "
                         "but this engine runs eager only so far; leave the graph options unset")


def _same_device(wanted: torch.device, actual: torch.device) -> bool:
    # "cuda" means the current CUDA device, so it matches "cuda:0" when that is where the model is.
    return wanted.type == actual.type and (wanted.index is None or wanted.index == actual.index)
