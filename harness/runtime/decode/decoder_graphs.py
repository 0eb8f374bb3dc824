"""DecoderGraphs: the decode graph flow, two passes or (opt-in) one, and serving from the graphs.

Two passes (the default): every shape runs eagerly first, so shared buffers (the workspace) reach
their largest size, then every shape runs its own warmup forward and is captured. One pass (opt-in):
each shape runs its warmup forward right before its capture, the addresses each graph baked in are
recorded, and after the last capture the ranks agree whether anything moved; if so every rank
clears its graphs and captures again with two passes, warning with the moved tensors.

The pieces live next door: the decision (blockers.py, and the phase rule of the `CapturePolicy` in
policy.py), what the ranks agree on (agreement.py), the dummy batches (dummy.py), which graph a
batch replays and the fallbacks counted when none does (serving.py).

- Up front the ranks agree (one allgather) whether to try the single pass: each rank contributes its
  own switch, so one rank without it keeps all on two passes. A rank that set the switch but cannot
  use it logs the blocker's reason.
- The ranks also agree which shapes every rank can build (a rank whose KV cache is too small for a
  shape's dummy batch would skip it), so no rank waits in a line-up its peers skip.
- The single pass does nothing twice: not the eager-workspace reservation (an eager forward of
  max_num_tokens rows) that an earlier phase made in the same workspace (the workspace only grows),
  nor a size's model warmup for its second and later sampling variants.
- Every warmup forward runs under the caller's "warmup" scope and every capture under the scope the
  policy names ("serving": the communication timeouts the graph keeps).
- After each capture the ranks line up (device sync + one allgather) before the replay that follows.

Sampling variants (`top_ks`, from `EngineConfig.graph_top_k`): without them each size has one graph
that outputs logits (variant "greedy"). With them each size has one graph per k, variant f"top{k}",
whose captured step also ranks the logits and packs the ranking for its transfer to the host
(`rank(logits, size, k)`: the torch ops' `pack_ranking(rank_logits(logits, k), size)` unless the
engine fuses the greedy ranking, `harness::greedy_pack` at k = 1). `graph_key` is the one place a
key is made, at capture and at replay.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch

from harness.graphs.base import GraphBackend
from harness.graphs.pointers import TensorRecord
from harness.ops.metadata import SequenceSpan
from harness.ops.greedy_ranking import rank_and_pack
from harness.ranking import PackedRanking
from harness.runtime.comm import Comm, SingleProcessComm
from harness.runtime.decode.blockers import CaptureFeatures, single_pass_blocker
from harness.runtime.decode.dummy import buildable_sizes, dummy_batch
from harness.runtime.decode.policy import (SERVE, WARMUP_SCOPE, CapturePolicy, ScopeFactory,
                                           default_capture_policy, no_scope)
from harness.runtime.decode.runner import DecodeGraphKey, GraphRunner, PaddedDecodeBatch, pad_decode_batch, sampling_variant
from harness.runtime.decode.serving import (GraphChoice, GraphStep, choose_graph, copy_out,
                                            copy_packed_out, missing_key_reason)
from harness.runtime.stats import StatsRecorder

log = logging.getLogger(__name__)

MOVED_FALLBACK = "single-pass capture discarded: a captured tensor moved"


class DecodeHost(Protocol):
    """What the graph manager needs of the engine: the model and the buffers its graphs read."""

    model: Any
    metadata: Any
    kv_cache: Any
    input_ids: torch.Tensor

    def prepare_padded(self, spans: tuple[SequenceSpan, ...], *, num_tokens: int, num_seqs: int,
                       input_ids: tuple[int, ...]) -> None: ...


@dataclass(frozen=True)
class GraphRoute:
    """Which graph a decode batch of some size and logprob width replays: `choice`, and where it
    names a size, its `key` and `producer` (`str(key)`); `missing` says why that key has no graph
    (None: it has one)."""

    choice: GraphChoice
    key: DecodeGraphKey | None = None
    producer: str = ""
    missing: str | None = None


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


class DecoderGraphs:
    """Decode graphs of `sizes` for `host`, captured by `warmup_and_capture` and replayed by `run`."""

    # A subclass whose shapes rely on the warmup-only pass sets this to False.
    supports_single_pass_capture = True

    def __init__(self, host: DecodeHost, backend: GraphBackend, sizes: tuple[int, ...], *,
                 stats: StatsRecorder, max_num_tokens: int, comm: Comm | None = None,
                 capture_scope: ScopeFactory = no_scope, single_pass: bool = False,
                 strict: bool = False, features: CaptureFeatures = CaptureFeatures(),
                 top_ks: tuple[int, ...] = (), policy: CapturePolicy | None = None,
                 step: Callable[..., torch.Tensor] | None = None,
                 rank: Callable[[torch.Tensor, int, int], PackedRanking] | None = None) -> None:
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
        self.policy = policy if policy is not None else default_capture_policy()
        # What a graph captures and its warmup runs: `step(input_ids, metadata, kv_cache)`, the
        # model itself unless the engine compiles it (runtime/compiled/step.py).
        self.step = step
        # How a top-k graph ranks its logits: `rank(logits, rows, k)`, the torch ops unless the
        # engine fuses the greedy ranking (greedy_ranking.py).
        self.rank = rank if rank is not None else rank_and_pack
        # (workspace, capacity) after the last eager-workspace reservation: the workspace only grows,
        # so a later single pass against the same workspace need not reserve it again.
        self._reserved: tuple[Any, int] | None = None
        self.runner = GraphRunner(backend, self._roots, self._prepared_shape, strict=strict)
        self.reports: list[CaptureReport] = []
        # (num_seqs, logprob width) -> its route, valid for one runner generation: every decode
        # step asks twice (the engine's dispatch, then `run`), with the same few answers.
        self._routes: dict[tuple[int, int], GraphRoute] = {}
        self._routes_generation = -1

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

    def single_pass_blocker(self) -> str | None:
        """Why the warmup-only pass must not be skipped here, or None (blockers.py)."""
        return single_pass_blocker(self.features, self.runner.keys,
                                   supports_single_pass=self.supports_single_pass_capture,
                                   owner=type(self).__name__)

    # --- the flow -----------------------------------------------------------------------------

    def warmup_and_capture(self, phase: str = SERVE) -> CaptureReport:
        policy, agreement = self.policy, self.policy.agreement
        requested = self.single_pass_requested
        blocker = self.single_pass_blocker() if requested else None
        if blocker is not None:
            log.warning("single_pass_capture is ignored: %s", blocker)
        wants = requested and blocker is None and policy.single_pass_allowed_in(phase)
        single = agreement.single_pass(self.comm, wants)
        sizes, skipped = agreement.sizes(self.comm, self.sizes, buildable_sizes(self.host.kv_cache, self.sizes))
        if skipped:
            log.warning("no decode graph for sizes %s: some rank cannot build their dummy batch "
                        "(too few free KV blocks)", skipped)
        moved: list[str] = []
        fell_back = False
        with self.capture_scope(WARMUP_SCOPE):
            if not (single and self._still_reserved()):
                self._reserve_eager_workspace()
            if single:
                passes, latest = self._capture_single_pass(sizes)
                moved = self.runner.moved_tensors(now=latest)
                if agreement.moved(self.comm, moved):
                    fell_back = True
                    self._discard_single_pass()
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

    def _discard_single_pass(self) -> None:
        detail = "\n".join(f"  {line}" for line in self.runner.describe_moved().splitlines()) or \
            "  (moved on another rank)"
        log.warning("single_pass_capture: tensors moved after their graph was captured; clearing "
                    "every decode graph and capturing again with two passes. Moved:\n%s\nRemedy: "
                    "size shared buffers for the largest shape before capture, or leave "
                    "single_pass_capture off for this model.", detail)
        self.stats.fallbacks[MOVED_FALLBACK] += 1
        self.runner.clear()

    def _capture_two_passes(self, sizes: list[int]) -> int:
        for size in sizes:
            with dummy_batch(self.host.kv_cache, size) as batch:
                self._prepare(batch)
                self.warmup_step()
        for size in sizes:
            for top_k in self._variants():
                self._warmup_and_capture_one(size, top_k, record=False)
        return 2

    def _capture_single_pass(self, sizes: list[int]) -> tuple[int, Mapping[str, TensorRecord] | None]:
        """The passes (one), and the records of the last graph captured (None: none was): all that
        ran since is that graph's line-up and replay, so they are the present the moved-tensor
        check compares with, one snapshot fewer than taking it afresh."""
        latest = None
        for size in sizes:
            for i, top_k in enumerate(self._variants()):
                # A size's later variants capture the same model step: its warmup ran for the first.
                key = self._warmup_and_capture_one(size, top_k, record=True, warm_model=i == 0)
                if key is not None:
                    latest = self.runner.records(key)
        return 1, latest

    def _warmup_and_capture_one(self, size: int, top_k: int | None, *, record: bool,
                                warm_model: bool = True) -> DecodeGraphKey | None:
        """Warm up and capture `size`'s graph of `top_k`; its key, or None if it was captured
        already."""
        key = self.graph_key(size, top_k)
        if key in self.runner:
            return None
        with dummy_batch(self.host.kv_cache, size) as batch:
            self._prepare(batch)
            if warm_model:
                self.warmup_step()  # the warmup forward right before the capture
            if top_k is not None:
                self._warmup_ranking(size, top_k)
            self.runner.capture(key, self._captured_step(top_k),
                                scope=lambda: self.policy.capture_scope(self.capture_scope), record=record)
            self.stats.captures[str(key)] += 1
            self.policy.agreement.line_up(self.comm, self.backend, key)
            self.runner.replay(key)
        return key

    def _warmup_ranking(self, size: int, top_k: int) -> None:
        """The ranking's kernels run once before their capture, as the model's do."""
        model = self.host.model
        logits = torch.zeros(size, model.vocab_size, dtype=model.dtype, device=model.device)
        self.rank(logits, size, top_k)

    def warmup_step(self) -> torch.Tensor:
        """A warmup forward of the prepared dummy batch: the step its graph will capture, run once
        outside the capture (a compiled step compiles the shape here, never inside the capture)."""
        return self._model_step()

    def _model_step(self) -> torch.Tensor:
        host = self.host
        step = self.step if self.step is not None else host.model
        return step(host.input_ids, host.metadata, host.kv_cache)

    def _captured_step(self, top_k: int | None) -> Callable[[], Any]:
        """What a graph of this variant records: the model step, then the ranking for a top-k."""
        if top_k is None:
            return self._model_step

        def step_and_rank() -> PackedRanking:
            logits = self._model_step()
            return self.rank(logits, logits.shape[0], top_k)

        return step_and_rank

    def _reserve_eager_workspace(self) -> None:
        """An eager forward of max_num_tokens padded rows, so that no eager step (a long prefill)
        regrows the workspace after a graph baked in its address."""
        self.host.prepare_padded((), num_tokens=self.max_num_tokens, num_seqs=0, input_ids=())
        host = self.host
        # The eager model: the rows are a prefill's, which the eager ops serve.
        host.model(host.input_ids, host.metadata, host.kv_cache)
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

    def _prepare(self, batch: PaddedDecodeBatch, input_ids: tuple[int, ...] | None = None) -> None:
        ids = input_ids if input_ids is not None else (0,) * len(batch.spans)
        self.host.prepare_padded(batch.spans, num_tokens=batch.num_tokens, num_seqs=batch.num_seqs,
                                 input_ids=ids)

    # --- serving ------------------------------------------------------------------------------

    def run(self, spans: tuple[SequenceSpan, ...], input_ids: tuple[int, ...],
            logprobs: Sequence[int] = (), *, copy: bool = True) -> GraphStep | None:
        """Replay the smallest fitting graph for a decode batch whose sequences asked for
        `logprobs` top entries each; None (counted, with its reason) when no graph fits.
        `copy=False` hands out the graph's static output, which the next replay overwrites: only
        for a caller whose every read of it is queued before that replay (the overlap loop)."""
        n = len(spans)
        route = self._route(n, max(max(logprobs, default=0), 1))
        choice, key = route.choice, route.key
        if choice.reason is not None:
            self.stats.fallbacks[choice.reason] += 1
            return None
        if route.missing is not None:
            self.stats.fallbacks[route.missing] += 1
            return None
        self._prepare(pad_decode_batch(spans, key.batch_size), input_ids)
        output = self.runner.replay(key)
        self.stats.replays[route.producer] += 1
        if choice.top_k is None:
            logits = output[:n]
            return GraphStep(logits=copy_out(logits) if copy else logits, key=key)
        packed = PackedRanking(values=output.values[:n], tokens=output.tokens[:n])
        return GraphStep(logits=None, key=key, packed=copy_packed_out(packed) if copy else packed)

    def _route(self, num_seqs: int, width: int) -> GraphRoute:
        """The route of a decode batch of `num_seqs` wanting `width` logprobs, computed once per
        runner generation (a capture or clear starts a new one)."""
        runner = self.runner
        if self._routes_generation != runner.generation:
            self._routes.clear()
            self._routes_generation = runner.generation
        route = self._routes.get((num_seqs, width))
        if route is None:
            keys = runner.keys
            choice = choose_graph(keys, self.top_ks, num_seqs, (width,))
            key = missing = None
            if choice.reason is None:
                key = self.graph_key(choice.size, choice.top_k)
                missing = None if key in runner else missing_key_reason(num_seqs, key, keys)
            route = GraphRoute(choice, key, str(key) if key is not None else "", missing)
            self._routes[(num_seqs, width)] = route
        return route

    def size_for(self, num_seqs: int) -> int | None:
        """The captured batch size a decode batch of `num_seqs` replays (None: no graph holds it);
        `run` then picks that size's graph of the batch's sampling variant."""
        return self._route(num_seqs, 1).choice.size

    def no_graph_reason(self, num_seqs: int) -> str:
        """Why no graph holds a decode batch of `num_seqs` (when `size_for` says none does)."""
        return self._route(num_seqs, 1).choice.reason or ""

    def release(self) -> None:
        """Release every graph (the end of the estimation phase)."""
        self.runner.clear()
