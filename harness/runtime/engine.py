"""The engine: requests in, greedy generations with top-k logprobs out.

A step is: schedule a batch (scheduler.py), run the model on it (`_forward`), pick tokens and
logprobs (`harness.ranking.logits_to_steps`: greedy, ties to the lowest id), record the step.
`_forward(batch)` is where graph dispatch plugs in: it prepares the metadata for the batch, at the padded shape it chooses, and returns the logits of the
batch's real sequences with the name of whatever produced them ("eager" or a graph key).

Graph mode (`EngineConfig.decode_graph_sizes`): the engine holds a `DecoderGraphs`
(runtime/decode/decoder_graphs.py). Graphs are captured in two phases, as a serving runtime does: phase 1
(`estimate_kv_cache`) captures against a first KV cache to size the final one, always with two
passes, then releases every graph; phase 2 (`finalize_kv_cache`) reallocates the KV cache and the
metadata and captures again against them. `generate` runs both on first use if no one did.
With `EngineConfig.graph_top_k` the decode graphs rank the logits themselves (one graph per size
and k), and the step loop turns their ranking into Steps, each request keeping its own `logprobs`.
With `EngineConfig.overlap` the steps run through the overlap loop (overlap.py) instead: the same
`_forward`, one step in flight, tokens read one step late.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence as Seq, TypeVar

import torch

from harness.graphs import get_backend
from harness.graphs.base import GraphBackend
from harness.ranking import PackedRanking, logits_to_steps
from harness.ops.decode_kernel import choose_decode_kernel
from harness.ops.rope_kv_choice import choose_rope_kv_write
from harness.ops.decode_linear_choice import choose_decode_linear
from harness.ops.greedy_ranking import rank_and_pack
from harness.ops.greedy_ranking_choice import choose_greedy_ranking
from harness.ops.pdl_choice import choose_pdl
from harness.ops.kv_cache import PagedKVCache
from harness.ops.metadata import AttentionMetadata
from harness.ops.sizing import cdiv
from harness.records import EAGER, Generation, Request, Step
from harness.runtime.comm import Comm
from harness.runtime.compiled.piece import inductor_piece_compiler
from harness.runtime.compiled.step import CompiledStep
from harness.runtime.config import EngineConfig
from harness.runtime.decode.blockers import CaptureFeatures
from harness.runtime.decode.decoder_graphs import CaptureReport, DecoderGraphs
from harness.runtime.decode.policy import (ESTIMATE, SERVE, CapturePolicy, ScopeFactory,
                                           default_capture_policy, no_scope)
from harness.runtime import dispatch
from harness.runtime.dispatch import DECODE, PIECEWISE
from harness.runtime.overlap import InputFeed, OverlapLoop
from harness.runtime.piecewise.model import PiecewiseGraphs, bucket_key
from harness.runtime.piecewise.policy import PiecewisePolicy, default_piecewise_policy
from harness.runtime.scheduler import ScheduledBatch, Scheduler, Sequence
from harness.runtime.stats import BatchRecord, EngineStats, StatsRecorder
from harness.runtime.validation import BadRequestError, RequestLimits, RequestProblem, check_request

_Choice = TypeVar("_Choice")  # a chosen kernel or mode: `fell_back`, and its `reason`

@dataclass(frozen=True)
class ForwardResult:
    """A step's model output: its logits, or (from a decode graph that ranks on the device) its
    packed ranking, with the name of whatever produced it."""

    logits: torch.Tensor | None  # [batch.num_seqs, vocab], float32
    producer: str
    packed: PackedRanking | None = None

    def steps(self, logprobs: list[int]) -> list[Step]:
        """One Step per sequence, greedy, each keeping its own `logprobs` top entries."""
        if self.packed is not None:
            return self.packed.steps(logprobs, self.producer)
        return logits_to_steps(self.logits, logprobs, self.producer)


class Engine:
    """Greedy generation on a `ReferenceLlama` with a paged KV cache.

    - Greedy: the argmax of each step's logits, ties to the lowest token id. There is no EOS: every
      request generates exactly `max_new_tokens` tokens, so runs compare step for step.
    - Batching (scheduler.py): all requests are admitted on the first step when the limits allow;
      decode batches then shrink as requests finish, and a request's KV blocks are freed the step it
      finishes.
    - `backend` (a GraphBackend) captures the graphs; eager mode never uses it. In graph mode it
      defaults to real CUDA graphs for a model on cuda and the emulator otherwise.
    - `comm`, `capture_scope`, `capture_features`: rank agreement, the warmup/serving scope factory
      and the warmup-pass duties, handed to the decode graph manager (runtime/decode/decoder_graphs.py).
    - `capture_policy` (runtime/decode/policy.py) and `piecewise_policy` (runtime/piecewise/
      policy.py): the decisions of decode capture (rank agreement, phases, scopes) and the pool
      factory and split predicate of the piecewise backend; None takes `default_capture_policy()`
      and `default_piecewise_policy()`.
    - `compiled_step`: with `compile="inductor"`, a CompiledStep of another engine to share (same
      model and graph backend), so engines of one model compile each shape once (the bench builds
      a dozen); None builds the engine's own.
    """

    def __init__(self, model, config: EngineConfig | None = None, backend: GraphBackend | None = None,
                 *, comm: Comm | None = None, capture_scope: ScopeFactory = no_scope,
                 capture_features: CaptureFeatures = CaptureFeatures(),
                 capture_policy: CapturePolicy | None = None,
                 piecewise_policy: PiecewisePolicy | None = None,
                 compiled_step: CompiledStep | None = None) -> None:
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
        if config.max_model_len is not None and config.max_model_len > model.max_positions:
            raise ValueError(f"EngineConfig.max_model_len {config.max_model_len} exceeds the model's "
                             f"max_position_embeddings {model.max_positions}")
        self.max_model_len = config.max_model_len or model.max_positions
        self.dtype = dtype
        self._stats = StatsRecorder()
        # What attends decode-only batches, and why: the metadata carries it to every attention op.
        self.decode_kernel = self._counted(choose_decode_kernel(config.decode_kernel, self.device),
                                           "decode kernel torch")
        # How the layers rotate and store K/V, and why: the metadata carries it to the model.
        self.rope_kv_write = self._counted(choose_rope_kv_write(config.rope_kv_write, self.device),
                                           "rope + KV write separate")
        # How the layers' linear layers run for decode-sized batches: the metadata carries it too.
        self.decode_linear = self._counted(choose_decode_linear(config.decode_linear, self.device),
                                           "decode linear separate")
        # Whether those Triton kernels are launched with PDL: the metadata carries it to the ops.
        self.pdl = self._counted(choose_pdl(config.pdl, self.device), "PDL off")
        # How a top-1 decode graph ranks its logits (eager steps rank with the torch ops).
        self.greedy_ranking = self._counted(
            choose_greedy_ranking(config.greedy_ranking, self.device), "greedy ranking separate")
        blocks_per_seq = cdiv(self.max_model_len, config.block_size)
        self._allocate_kv_cache(config.num_blocks or config.max_batch_size * blocks_per_seq)
        # Token ids live in one preallocated buffer, like the metadata, so a graph can read them.
        self.input_ids = torch.zeros(config.max_num_tokens, dtype=torch.int64, device=self.device)
        # The overlap loop (overlap.py) writes token ids through pinned staging and feeds pending
        # tokens from the device; `before_launch`, when set, is called at the start of each of its
        # steps, before any of the step's device work is queued (tests stall the stream there).
        self.input_feed = InputFeed(self.input_ids, config.max_batch_size) if config.overlap else None
        self.before_launch: Callable[[], None] | None = None
        if self.backend is None and (config.decode_graph_sizes or config.piecewise_buckets):
            self.backend = get_backend("cuda" if self.device.type == "cuda" else "emulated", self.device)
        self.capture_policy = capture_policy if capture_policy is not None else default_capture_policy()
        # The compiled path (runtime/compiled/): decode steps, eager or captured, run the compiled step.
        self.compiled_step = self._compiled_step(config, compiled_step)
        self.decode_graphs = self._make_decode_graphs(self.backend, comm, capture_scope, capture_features)
        self.piecewise = self._build_piecewise(config, self.backend, piecewise_policy)
        self._graphs_ready = False

    def rank_and_pack(self, logits: torch.Tensor, n: int, width: int) -> PackedRanking:
        """The first `n` rows of a decode graph's `logits` ranked `width` wide and packed for the
        one transfer to the host, as `EngineConfig.greedy_ranking` and `pdl` say (greedy_ranking.py)."""
        return rank_and_pack(logits, n, width, mode=self.greedy_ranking.mode, pdl=self.pdl.enabled)

    def _compiled_step(self, config: EngineConfig, shared: CompiledStep | None) -> CompiledStep | None:
        # The backend that captures the step: none without graphs, where a given backend is kept
        # but unused (and need not be a GraphBackend at all).
        graphs = self.backend if (config.decode_graph_sizes or config.piecewise_buckets) else None
        if shared is None:
            return (CompiledStep(self.model, graphs, self.decode_kernel.kernel,
                                 self.rope_kv_write.mode, self.decode_linear.mode, self.pdl.enabled)
                    if config.compile == "inductor" else None)
        if config.compile != "inductor":
            raise ValueError(f"a compiled_step was given to an engine of EngineConfig.compile="
                             f"{config.compile!r}; give it with compile='inductor' only")
        if shared.model is not self.model or shared.graph_backend is not graphs:
            raise ValueError(f"the compiled_step given was built for another model or graph backend "
                             f"({shared.graph_backend.name if shared.graph_backend else None}, this "
                             f"engine's is {graphs.name if graphs else None}); share it "
                             f"only between engines of one model and one backend")
        if shared.decode_kernel != self.decode_kernel.kernel:
            raise ValueError(f"the compiled_step given attends decode batches with "
                             f"{shared.decode_kernel!r}, this engine with {self.decode_kernel.kernel!r}; "
                             f"share it only between engines of one decode kernel")
        if shared.rope_kv_write != self.rope_kv_write.mode:
            raise ValueError(f"the compiled_step given rotates and stores K/V {shared.rope_kv_write!r}, "
                             f"this engine {self.rope_kv_write.mode!r} (EngineConfig.rope_kv_write); "
                             f"share it only between engines of one rope_kv_write")
        if shared.decode_linear != self.decode_linear.mode:
            raise ValueError(f"the compiled_step given runs its linear layers {shared.decode_linear!r}, "
                             f"this engine {self.decode_linear.mode!r} (EngineConfig.decode_linear); "
                             f"share it only between engines of one decode_linear")
        if shared.pdl != self.pdl.enabled:
            raise ValueError(f"the compiled_step given launches its kernels with pdl={shared.pdl}, "
                             f"this engine with pdl={self.pdl.enabled} (EngineConfig.pdl); share it "
                             f"only between engines of one pdl")
        return shared

    def _counted(self, choice: _Choice, fallback: str) -> _Choice:
        """`choice` (a kernel or mode chosen for this device), its fallback counted under
        `fallback` with its reason where it fell back."""
        if choice.fell_back:
            self._stats.fallbacks[f"{fallback}: {choice.reason}"] += 1
        return choice

    def _allocate_kv_cache(self, num_blocks: int) -> None:
        """A KV cache of `num_blocks`, the metadata that points into it, and the request limits."""
        config, model = self.config, self.model
        blocks_per_seq = cdiv(self.max_model_len, config.block_size)
        self.kv_cache = PagedKVCache(model.num_layers, num_blocks, config.block_size, model.num_kv_heads,
                                     model.head_dim, dtype=self.dtype, device=self.device)
        self.metadata = AttentionMetadata(config.max_batch_size, config.max_num_tokens, blocks_per_seq,
                                          config.block_size, self.kv_cache.pad_slot, device=self.device,
                                          decode_kernel=self.decode_kernel.kernel,
                                          rope_kv_write=self.rope_kv_write.mode,
                                          decode_linear=self.decode_linear.mode,
                                          pdl=self.pdl.enabled)
        self.limits = RequestLimits(vocab_size=model.vocab_size, max_model_len=self.max_model_len,
                                    max_prompt_len=config.max_num_tokens, num_blocks=num_blocks,
                                    block_size=config.block_size,
                                    lookahead_tokens=self._lookahead_tokens)

    @property
    def _lookahead_tokens(self) -> int:
        """KV room a request reserves past its last fed token: the overlap loop's extra step."""
        return 1 if self.config.overlap else 0

    def _make_decode_graphs(self, backend, comm, capture_scope, features) -> DecoderGraphs | None:
        config = self.config
        if not config.decode_graph_sizes:
            if config.graph_top_k:
                raise ValueError(f"EngineConfig.graph_top_k {list(config.graph_top_k)} needs decode graphs "
                                 "to rank in; set decode_graph_sizes too")
            return None
        over_vocab = [k for k in config.graph_top_k if k > self.model.vocab_size]
        if over_vocab:
            raise ValueError(f"EngineConfig.graph_top_k {over_vocab} exceed the vocabulary size "
                             f"{self.model.vocab_size}")
        too_large = [s for s in config.decode_graph_sizes if s > config.max_batch_size]
        if too_large:
            raise ValueError(f"EngineConfig.decode_graph_sizes {list(too_large)} exceed max_batch_size "
                             f"{config.max_batch_size}")
        return DecoderGraphs(self, backend, config.decode_graph_sizes, stats=self._stats,
                             max_num_tokens=config.max_num_tokens, comm=comm,
                             capture_scope=capture_scope, single_pass=bool(config.single_pass_capture),
                             strict=config.strict_graph_buffers, features=features,
                             top_ks=config.graph_top_k, policy=self.capture_policy,
                             step=self.compiled_step, rank=self.rank_and_pack)

    # --- phases (graph mode) ----------------------------------------------------------------------

    def estimate_kv_cache(self) -> int:
        """Phase 1: capture against the first KV cache (always two passes), then release every
        graph. Returns the number of KV blocks for the final cache (the first cache's size: this
        reference runtime measures no memory)."""
        if self.decode_graphs is not None:
            self.decode_graphs.warmup_and_capture(ESTIMATE)
            if self.capture_policy.recaptures_for_final_cache():
                self.decode_graphs.release()
        if self.piecewise is not None:
            self.piecewise.capture()
            self.piecewise.clear()
        return self.kv_cache.num_blocks

    def finalize_kv_cache(self, num_blocks: int | None = None) -> None:
        """Phase 2: reallocate the KV cache (and the metadata pointing into it) with `num_blocks`,
        then capture every decode graph again against them."""
        self._allocate_kv_cache(num_blocks or self.kv_cache.num_blocks)
        if self.decode_graphs is not None and self.capture_policy.recaptures_for_final_cache():
            self.decode_graphs.release()
            self.decode_graphs.warmup_and_capture(SERVE)
        if self.piecewise is not None:
            self.piecewise.clear()
            self.piecewise.attach(self.kv_cache, self.metadata)
            self.piecewise.capture()
        self._graphs_ready = True

    def prepare_graphs(self) -> None:
        """Both phases, as a serving runtime runs them at startup."""
        self.finalize_kv_cache(self.estimate_kv_cache())

    @property
    def capture_reports(self) -> list[CaptureReport]:
        return [] if self.decode_graphs is None else list(self.decode_graphs.reports)

    def _build_piecewise(self, config: EngineConfig, backend: GraphBackend | None,
                         policy: PiecewisePolicy | None) -> PiecewiseGraphs | None:
        if not config.piecewise_buckets:
            return None
        return PiecewiseGraphs(self.model, self.kv_cache, self.metadata, self.input_ids,
                               config.piecewise_buckets, backend, self._stats,
                               policy=policy if policy is not None else default_piecewise_policy(),
                               compile_piece=inductor_piece_compiler(backend) if config.compile == "inductor"
                               else None)

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
        if (self.decode_graphs is not None or self.piecewise is not None) and not self._graphs_ready:
            self.prepare_graphs()
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
                              max_num_tokens=self.config.max_num_tokens, block_size=self.config.block_size,
                              lookahead_tokens=self._lookahead_tokens)
        for sequence in sequences:
            scheduler.add(sequence)
        try:
            if self.config.overlap:
                widths = [s.request.logprobs for s in sequences]
                OverlapLoop(self, max(widths, default=1)).run(scheduler)
            else:
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
            steps = result.steps([s.request.logprobs for s in batch.sequences])
            for sequence, step in zip(batch.sequences, steps):
                sequence.steps.append(step)
                sequence.tokens.append(step.token)
            scheduler.finish_step(batch)
            self._stats.record_batch(BatchRecord(kind=batch.kind, num_seqs=batch.num_seqs,
                                                 num_tokens=batch.num_tokens, producer=result.producer,
                                                 free_blocks=self.num_free_blocks))

    def _prepare(self, batch: ScheduledBatch, *, num_tokens: int | None = None,
                 num_seqs: int | None = None) -> None:
        """Copy the batch into the metadata and input buffers, padded to the given shape."""
        self.prepare_padded(batch.spans, num_tokens=num_tokens, num_seqs=num_seqs, input_ids=batch.input_ids)

    def prepare_padded(self, spans, *, num_tokens: int | None = None, num_seqs: int | None = None,
                       input_ids=()) -> None:
        """Copy a batch into the metadata and input buffers, padded to the given shape."""
        self.metadata.prepare(list(spans), num_tokens=num_tokens, num_seqs=num_seqs)
        # Padded token rows read token 0; their K/V goes to the pad sink and their logits are dropped.
        # One host tensor and one copy for the real and the padded rows together.
        padded = self.metadata.num_tokens
        if padded:
            ids = list(input_ids) + [0] * (padded - len(input_ids))
            if self.input_feed is not None:
                self.input_feed.write(self.input_ids, ids)
            else:
                self.input_ids[:padded].copy_(torch.tensor(ids, dtype=torch.int64))

    def _forward(self, batch: ScheduledBatch, *, copy: bool = True) -> ForwardResult:
        """`copy=False`: a decode graph's static output is handed out uncopied (the overlap loop
        queues its every read before the next replay)."""
        buckets = self.piecewise.buckets if self.piecewise is not None else ()
        chosen = dispatch.route(batch.kind, batch.num_seqs, batch.num_tokens,
                                decode_graphs=self.decode_graphs, buckets=buckets)
        if chosen.kind == PIECEWISE:
            return self._forward_piecewise(batch, chosen.size)
        if chosen.kind == DECODE:
            step = self.decode_graphs.run(batch.spans, batch.input_ids,
                                          [s.request.logprobs for s in batch.sequences], copy=copy)
            if step is not None:  # None: no graph of this batch's variant; run() counted it
                return ForwardResult(logits=step.logits, producer=str(step.key), packed=step.packed)
        elif chosen.fallback:
            self._stats.fallbacks[chosen.reason] += 1
        return self._forward_eager(batch)

    def _forward_eager(self, batch: ScheduledBatch) -> ForwardResult:
        self._prepare(batch)
        if self.compiled_step is not None and batch.kind == DECODE:
            return self._forward_compiled(batch)
        logits = self.model(self.input_ids, self.metadata, self.kv_cache)
        return ForwardResult(logits=logits[: batch.num_seqs], producer=EAGER)

    def _forward_compiled(self, batch: ScheduledBatch) -> ForwardResult:
        """A decode batch no graph serves, through the compiled step. A compile here is for a shape
        no graph holds (the step runs a known shape's code without guards, so it never recompiles
        one): counted in `stats.eager_compiles`, not in the fallbacks, where the batch's route
        counted it already if running outside the graphs was a fallback."""
        compiles = self.compiled_step.compiles
        logits = self.compiled_step(self.input_ids, self.metadata, self.kv_cache)
        if self.compiled_step.compiles != compiles:
            self._stats.eager_compiles[eager_compile_reason(batch.num_seqs, batch.num_tokens)] += 1
        return ForwardResult(logits=logits[: batch.num_seqs], producer=EAGER)

    def _forward_piecewise(self, batch: ScheduledBatch, bucket: int) -> ForwardResult:
        self._prepare(batch, num_tokens=bucket)
        logits = self.piecewise.run(batch.num_seqs, bucket)
        return ForwardResult(logits=logits, producer=bucket_key(bucket))


def eager_compile_reason(num_seqs: int, num_tokens: int) -> str:
    """The name an eager decode batch's compile is counted under in `stats.eager_compiles`."""
    return f"compiled step compiled for an eager decode batch of {num_seqs} ({num_tokens} token rows)"


def _same_device(wanted: torch.device, actual: torch.device) -> bool:
    # "cuda" means the current CUDA device, so it matches "cuda:0" when that is where the model is.
    return wanted.type == actual.type and (wanted.index is None or wanted.index == actual.index)
