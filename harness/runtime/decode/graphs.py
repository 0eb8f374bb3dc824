"""warmup_and_capture: the decoder graph flow, two passes or (opt-in) one, with rank agreement.

Two passes (the default): every shape runs eagerly first, so shared buffers (the workspace) reach
their largest size, then every shape runs its own warmup forward and is captured. One pass (opt-in):
each shape runs its warmup forward right before its capture, the addresses each graph baked in are
recorded, and after the last capture the ranks agree whether anything moved; if so every rank
clears its graphs and captures again with two passes, warning with the moved tensors.

- Up front the ranks agree (one allgather) whether to try the single pass: each rank contributes its
  own switch, so one rank without it keeps all on two passes. A rank that set the switch but cannot
  use it logs the blocker's reason.
- The ranks also agree which shapes every rank can build (a rank whose KV cache is too small for a
  shape's dummy batch would skip it), so no rank waits in a line-up its peers skip.
- The KV-cache estimation phase always captures with two passes.
- The single pass does nothing twice: not the eager-workspace reservation (an eager forward of
  max_num_tokens rows) that an earlier phase made in the same workspace (the workspace only grows),
  nor a size's model warmup for its second and later sampling variants.
- Every warmup forward runs under the caller's "warmup" scope and every capture under "serving"
  (the reference: communication timeouts; the graph keeps the serving ones).
- After each capture the ranks line up (device sync + one allgather) before the replay that follows.

Sampling variants (`top_ks`, from `EngineConfig.graph_top_k`): without them each size has one graph
that outputs logits (variant "greedy"). With them each size has one graph per k, variant f"top{k}",
whose captured step also ranks the logits (`rank_logits(logits, k)`), so its static outputs are the
best k ids, their logprobs and the logit scales. A decode batch replays the smallest k that covers
its largest requested `logprobs` (at least 1: the token itself); a batch wanting more than every k
runs eagerly and is counted. `graph_key` is the one place a key is made, at capture and at replay.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, Protocol, Sequence

import torch

from harness.graphs.base import GraphBackend
from harness.ranking import RankedLogits, rank_logits
from harness.ops.metadata import SequenceSpan
from harness.ops.sizing import cdiv
from harness.runtime.comm import Comm, SingleProcessComm, agree_on_graph
from harness.runtime.decode.runner import (DecodeGraphKey, GraphRunner, PaddedDecodeBatch, pad_decode_batch,
                                          sampling_variant)
from harness.runtime.stats import StatsRecorder

log = logging.getLogger(__name__)

ESTIMATE = "estimate"  # phase 1: KV-cache estimation
SERVE = "serve"  # phase 2: the final KV cache
WARMUP_SCOPE = "warmup"
SERVING_SCOPE = "serving"
DUMMY_SEQ_LEN = 2  # the shortest decode: one cached token and one new

ScopeFactory = Callable[[str], ContextManager[Any]]


def no_scope(name: str) -> ContextManager[Any]:
    return contextlib.nullcontext()


class DecodeHost(Protocol):
    """What the graph manager needs of the engine: the model and the buffers its graphs read."""

    model: Any
    metadata: Any
    kv_cache: Any
    input_ids: torch.Tensor

    def prepare_padded(self, spans: tuple[SequenceSpan, ...], *, num_tokens: int, num_seqs: int,
                       input_ids: tuple[int, ...]) -> None: ...


@dataclass(frozen=True)
class CaptureFeatures:
    """Duties of the warmup-only pass beyond warming up, each a reason not to skip it."""

    lora_graphs: bool = False
    tunes_kernels_in_warmup: bool = False
    pipeline_parallel_size: int = 1


@dataclass(frozen=True)
class CaptureReport:
    """What one warmup_and_capture did, for logs, stats and tests."""

    phase: str
    single_pass_requested: bool
    blocker: str | None
    single_pass_tried: bool
    fell_back: bool
    passes: int
    keys: tuple[str, ...]
    moved: tuple[str, ...] = ()
    skipped_sizes: tuple[int, ...] = ()


@dataclass(frozen=True)
class GraphStep:
    """One replay's output for the real sequences: logits (a "greedy" graph) or the ranking a
    f"top{k}" graph made on the device, padded rows included (`rows_from_ranked` drops them)."""

    logits: torch.Tensor | None  # [real sequences, vocab]
    key: DecodeGraphKey
    ranked: RankedLogits | None = None


def copy_out(static_output: torch.Tensor) -> torch.Tensor:
    """A replay's logits as a tensor of their own: the next replay overwrites the static output, and
    a caller may hold a step's result past it."""
    return static_output.clone()


def _estimation_uses_two_passes(phase: str) -> bool:
    return phase == ESTIMATE


class DecoderGraphs:
    """Decode graphs of `sizes` for `host`, captured by `warmup_and_capture` and replayed by `run`."""

    # A subclass whose shapes rely on the warmup-only pass sets this to False.
    supports_single_pass_capture = True

    def __init__(self, host: DecodeHost, backend: GraphBackend, sizes: tuple[int, ...], *,
                 stats: StatsRecorder, max_num_tokens: int, comm: Comm | None = None,
                 capture_scope: ScopeFactory = no_scope, single_pass: bool = False,
                 strict: bool = False, features: CaptureFeatures = CaptureFeatures(),
                 top_ks: tuple[int, ...] = ()) -> None:
        if not sizes:
            raise ValueError("DecoderGraphs needs at least one decode graph size")
        bad = [k for k in top_ks if not isinstance(k, int) or k < 1]
        if bad:
            raise ValueError(f"decode graph top-k values must be integers >= 1, got {bad}")
        self.host = host
        self.backend = backend
        self.sizes = tuple(sorted(set(sizes), reverse=True))
        self.top_ks = tuple(sorted(set(top_ks)))
        self.stats = stats
        self.max_num_tokens = max_num_tokens
        self.comm = comm or SingleProcessComm()
        self.capture_scope = capture_scope
        self.single_pass_requested = single_pass
        self.features = features
        # (workspace, capacity) after the last eager-workspace reservation: the workspace only grows,
        # so a later single pass against the same workspace need not reserve it again.
        self._reserved: tuple[Any, int] | None = None
        # Switched off only by tests that show what the fallback prevents.
        self.fallback_on_moved = True
        self.runner = GraphRunner(backend, self._roots, self._prepared_shape, strict=strict)
        self.reports: list[CaptureReport] = []

    # --- what graphs read -------------------------------------------------------------------

    def _roots(self) -> dict[str, Any]:
        host = self.host
        return {"metadata": host.metadata, "workspace": host.model.workspace,
                "input_ids": host.input_ids, "kv_cache": host.kv_cache}

    def _prepared_shape(self) -> tuple[int, int]:
        return self.host.metadata.num_seqs, self.host.metadata.num_tokens

    @property
    def keys(self) -> list[DecodeGraphKey]:
        return self.runner.keys

    def graph_key(self, batch_size: int, top_k: int | None) -> DecodeGraphKey:
        """The key of the graph for `batch_size` rows that ranks `top_k` logprobs (None: outputs
        logits). Capture and replay both ask here, so a key that lost its variant would hand a
        batch a graph ranking too few tokens."""
        return DecodeGraphKey.of(batch_size, sampling_variant(top_k))

    def _variants(self) -> tuple[int | None, ...]:
        """Each size's graphs, smallest k first: None alone when the host ranks."""
        return self.top_ks or (None,)

    # --- the decision -------------------------------------------------------------------------

    def single_pass_blocker(self) -> str | None:
        """Why the warmup-only pass must not be skipped here, or None."""
        if len(self.runner):
            return f"decode graphs are already captured ({', '.join(map(str, self.runner.keys))})"
        if self.features.lora_graphs:
            return "LoRA graphs are captured, and their kernels are tuned in the warmup-only pass"
        if self.features.tunes_kernels_in_warmup:
            return "kernels are tuned in the warmup-only pass"
        if not self.supports_single_pass_capture:
            return f"{type(self).__name__} sets supports_single_pass_capture = False"
        if self.features.pipeline_parallel_size > 1:
            return (f"pipeline parallelism ({self.features.pipeline_parallel_size} stages): a stage "
                    f"that skips a shape would miss its peers' line-up")
        return None

    def _agree_single_pass(self, wants: bool) -> bool:
        """One allgather: the single pass is tried only if every rank wants it."""
        return all(self.comm.allgather_object(bool(wants)))

    def _agree_moved(self, moved: list[str]) -> bool:
        """One allgather after the last capture: True if a tensor moved on any rank."""
        return any(self.comm.allgather_object(bool(moved)))

    def _dummy_blocks_per_seq(self) -> int:
        return cdiv(DUMMY_SEQ_LEN, self.host.kv_cache.block_size)

    def _buildable_sizes(self) -> list[int]:
        """Sizes whose dummy batch this rank can build with the KV blocks it has free."""
        free = self.host.kv_cache.allocator.num_free
        return [size for size in self.sizes if size * self._dummy_blocks_per_seq() <= free]

    def _agree_sizes(self) -> tuple[list[int], list[int]]:
        """(sizes every rank can build, sizes some rank cannot), largest first."""
        gathered = self.comm.allgather_object(self._buildable_sizes())
        common = set(self.sizes).intersection(*map(set, gathered))
        kept = [s for s in self.sizes if s in common]
        return kept, [s for s in self.sizes if s not in common]

    # --- the flow -----------------------------------------------------------------------------

    def warmup_and_capture(self, phase: str = SERVE) -> CaptureReport:
        requested = self.single_pass_requested
        blocker = self.single_pass_blocker() if requested else None
        if blocker is not None:
            log.warning("single_pass_capture is ignored: %s", blocker)
        wants = requested and blocker is None and not _estimation_uses_two_passes(phase)
        single = self._agree_single_pass(wants)
        sizes, skipped = self._agree_sizes()
        if skipped:
            log.warning("no decode graph for sizes %s: some rank cannot build their dummy batch "
                        "(too few free KV blocks)", skipped)
        moved: list[str] = []
        fell_back = False
        with self.capture_scope(WARMUP_SCOPE):
            if not (single and self._still_reserved()):
                self._reserve_eager_workspace()
            if single:
                passes = self._capture_single_pass(sizes)
                moved = self.runner.moved_tensors()
                if self._agree_moved(moved) and self.fallback_on_moved:
                    fell_back = True
                    self._discard_single_pass(moved)
                    passes += self._capture_two_passes(sizes)
            else:
                passes = self._capture_two_passes(sizes)
        self.stats.capture_passes[phase] += passes
        report = CaptureReport(phase=phase, single_pass_requested=requested, blocker=blocker,
                               single_pass_tried=single, fell_back=fell_back, passes=passes,
                               keys=tuple(map(str, self.runner.keys)), moved=tuple(moved),
                               skipped_sizes=tuple(skipped))
        if single and not fell_back:
            log.info("captured %d decode graphs without the warmup-only pass", len(self.runner))
        self.reports.append(report)
        return report

    def _discard_single_pass(self, moved: list[str]) -> None:
        detail = "\n".join(f"  {line}" for line in self.runner.describe_moved().splitlines()) or \
            "  (moved on another rank)"
        log.warning("single_pass_capture: tensors moved after their graph was captured; clearing "
                    "every decode graph and capturing again with two passes. Moved:\n%s\nRemedy: "
                    "size shared buffers for the largest shape before capture, or leave "
                    "single_pass_capture off for this model.", detail)
        self.stats.fallbacks["single-pass capture discarded: a captured tensor moved"] += 1
        self.runner.clear()

    def _capture_two_passes(self, sizes: list[int]) -> int:
        for size in sizes:
            self._warmup_only(size)
        for size in sizes:
            for top_k in self._variants():
                self._warmup_and_capture_one(size, top_k, record=False)
        return 2

    def _capture_single_pass(self, sizes: list[int]) -> int:
        for size in sizes:
            for i, top_k in enumerate(self._variants()):
                # A size's later variants capture the same model step: its warmup ran for the first.
                self._warmup_and_capture_one(size, top_k, record=True, warm_model=i == 0)
        return 1

    def _warmup_only(self, size: int) -> None:
        with self._dummy_batch(size) as batch:
            self._prepare(batch)
            self._warmup_forward(size)

    def _warmup_and_capture_one(self, size: int, top_k: int | None, *, record: bool,
                                warm_model: bool = True) -> None:
        key = self.graph_key(size, top_k)
        if key in self.runner:
            return
        with self._dummy_batch(size) as batch:
            self._prepare(batch)
            if warm_model:
                self._warmup_forward(size)
            if top_k is not None:
                self._warmup_ranking(size, top_k)
            self.runner.capture(key, self._captured_step(top_k), scope=self._serving_scope,
                                record=record)
            self.stats.captures[str(key)] += 1
            self._line_up(key)
            self.runner.replay(key)

    def _serving_scope(self) -> ContextManager[Any]:
        """The capture-scope entry: every capture runs under the serving scope."""
        return self.capture_scope(SERVING_SCOPE)

    def _warmup_forward(self, size: int) -> None:
        self._model_step()

    def _warmup_ranking(self, size: int, top_k: int) -> None:
        """The ranking's kernels run once before their capture, as the model's do."""
        model = self.host.model
        rank_logits(torch.zeros(size, model.vocab_size, dtype=model.dtype, device=model.device), top_k)

    def _model_step(self) -> torch.Tensor:
        host = self.host
        return host.model(host.input_ids, host.metadata, host.kv_cache)

    def _captured_step(self, top_k: int | None) -> Callable[[], Any]:
        """What a graph of this variant records: the model step, then the ranking for a top-k."""
        if top_k is None:
            return self._model_step

        def step_and_rank() -> RankedLogits:
            return rank_logits(self._model_step(), top_k)

        return step_and_rank

    def _line_up(self, key: DecodeGraphKey) -> None:
        """Before the replay that follows a capture: sync the device and meet every rank."""
        self.backend.synchronize()
        agree_on_graph(key, self.comm)

    def _reserve_eager_workspace(self) -> None:
        """An eager forward of max_num_tokens padded rows, so that no eager step (a long prefill)
        regrows the workspace after a graph baked in its address."""
        self.host.prepare_padded((), num_tokens=self.max_num_tokens, num_seqs=0, input_ids=())
        self._model_step()
        workspace = self.host.model.workspace
        self._reserved = (workspace, workspace.capacity)

    def _still_reserved(self) -> bool:
        """Whether an earlier phase's reservation still holds: the same workspace, not smaller.
        What the single pass would otherwise do twice (the estimation phase reserved it already);
        should anything regrow anyway, the moved-tensor check after the pass sees it."""
        if self._reserved is None:
            return False
        workspace, capacity = self._reserved
        return workspace is self.host.model.workspace and workspace.capacity >= capacity

    @contextlib.contextmanager
    def _dummy_batch(self, size: int) -> Iterator[PaddedDecodeBatch]:
        """`size` dummy decode sequences of two tokens, on KV blocks freed afterwards."""
        allocator = self.host.kv_cache.allocator
        per_seq = self._dummy_blocks_per_seq()
        blocks = allocator.allocate(size * per_seq)
        try:
            spans = tuple(SequenceSpan(seq_len=DUMMY_SEQ_LEN, query_len=1,
                                       block_table=tuple(blocks[i * per_seq:(i + 1) * per_seq]))
                          for i in range(size))
            yield pad_decode_batch(spans, size)
        finally:
            allocator.free(blocks)

    def _prepare(self, batch: PaddedDecodeBatch, input_ids: tuple[int, ...] | None = None) -> None:
        ids = input_ids if input_ids is not None else (0,) * len(batch.spans)
        self.host.prepare_padded(batch.spans, num_tokens=batch.num_tokens, num_seqs=batch.num_seqs,
                                 input_ids=ids)

    # --- serving ------------------------------------------------------------------------------

    def run(self, spans: tuple[SequenceSpan, ...], input_ids: tuple[int, ...],
            logprobs: Sequence[int] = ()) -> GraphStep | None:
        """Replay the smallest fitting graph for a decode batch whose sequences asked for
        `logprobs` top entries each; None (counted, with its reason) when no graph fits."""
        n = len(spans)
        width = max(max(logprobs, default=0), 1)
        top_k = self._top_k_for(width)
        size = min((k.batch_size for k in self.runner.keys if k.batch_size >= n), default=None)
        reason = self._no_graph_reason(n, width, top_k, size)
        if reason is not None:
            self.stats.fallbacks[reason] += 1
            return None
        key = self.graph_key(size, top_k)
        if key not in self.runner:
            self.stats.fallbacks[f"decode batch of {n}: no decode graph {key} (captured: "
                                 f"{', '.join(map(str, self.runner.keys))})"] += 1
            return None
        self._prepare(pad_decode_batch(spans, key.batch_size), input_ids)
        output = self.runner.replay(key)
        self.stats.replays[str(key)] += 1
        if top_k is None:
            return GraphStep(logits=copy_out(output[:n]), key=key)
        return GraphStep(logits=None, key=key, ranked=output)

    def size_for(self, num_seqs: int) -> int | None:
        """The captured batch size a decode batch of `num_seqs` replays (None: no graph holds it);
        `run` then picks that size's graph of the batch's sampling variant."""
        return min((k.batch_size for k in self.runner.keys if k.batch_size >= num_seqs), default=None)

    def no_graph_reason(self, num_seqs: int) -> str:
        """Why no graph holds a decode batch of `num_seqs` (when `size_for` says none does)."""
        return self._no_graph_reason(num_seqs, 1, self._top_k_for(1), None) or ""

    def _top_k_for(self, width: int) -> int | None:
        """The smallest captured k that ranks `width` entries; None for host ranking or none fits."""
        return min((k for k in self.top_ks if k >= width), default=None)

    def _no_graph_reason(self, n: int, width: int, top_k: int | None, size: int | None) -> str | None:
        if not len(self.runner):
            return f"decode batch of {n}: no decode graph captured"
        if self.top_ks and top_k is None:
            return (f"decode batch of {n} wants top-{width} logprobs, more than the largest "
                    f"graph_top_k ({max(self.top_ks)})")
        if size is None:
            largest = max(k.batch_size for k in self.runner.keys)
            return f"decode batch of {n} exceeds the largest decode graph ({largest})"
        return None

    def release(self) -> None:
        """Release every graph (the end of the estimation phase)."""
        self.runner.clear()
