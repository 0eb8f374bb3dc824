"""Faults planted in the decode graphs of the engine (harness.runtime.decode).

The flow's decisions are planted through the engine's capture policy (runtime/decode/policy.py): the
fault hands every engine built while it is planted a `CapturePolicy` (or `RankAgreement`) that
overrides one decision, by replacing `default_capture_policy`, which an engine built without a
policy asks. Key making and padding are planted in the public functions that do them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, ContextManager, Iterator, Sequence

from harness.faults.patching import replace_default, replace_function, replace_method
from harness.faults.registry import Fault, FaultHandle
from harness.runtime.comm import Comm
from harness.runtime.decode import policy as capture_policy
from harness.runtime.decode import runner as graph_runner
from harness.runtime.decode.agreement import RankAgreement
from harness.runtime.decode.decoder_graphs import DecoderGraphs
from harness.runtime.decode.policy import CapturePolicy, ScopeFactory
from harness.runtime.decode.runner import DecodeGraphKey, PaddedDecodeBatch, sampling_variant

SINGLE_PASS_PR = "https://github.com/NVIDIA/TensorRT-LLM/pull/21886"


def planted_policy(policy: CapturePolicy | None = None, *,
                   agreement: RankAgreement | None = None) -> ContextManager[None]:
    """Every engine built without a capture policy gets `policy` (or the default with `agreement`)."""
    return replace_default(capture_policy, "default_capture_policy",
                           lambda default: policy or dataclasses.replace(default, agreement=agreement))


@dataclass(frozen=True)
class MovedIgnored(RankAgreement):
    """Gathers whether a tensor moved, then answers no: the stale single-pass graphs stay."""

    handle: Any = None

    def moved(self, comm: Comm, moved: Sequence[str]) -> bool:
        if super().moved(comm, moved):
            self.handle.fire()
        return False


@dataclass(frozen=True)
class EachRankDecides(RankAgreement):
    """The single-pass decision is this rank's own switch, never gathered from its peers."""

    handle: Any = None

    def single_pass(self, comm: Comm, wants: bool) -> bool:
        self.handle.fire()
        return bool(wants)


@dataclass(frozen=True)
class NoRecapture(CapturePolicy):
    """Phase 1's graphs are kept, baked into the first KV cache, and phase 2 captures nothing."""

    handle: Any = None

    def recaptures_for_final_cache(self) -> bool:
        self.handle.fire()
        return False


@dataclass(frozen=True)
class CaptureWithoutScope(CapturePolicy):
    """Captures run under no scope: the graph keeps the warmup's communication timeouts."""

    handle: Any = None

    def capture_scope(self, scopes: ScopeFactory) -> ContextManager[Any]:
        self.handle.fire()
        return contextlib.nullcontext()


@dataclass(frozen=True)
class SinglePassEverywhere(CapturePolicy):
    """The estimation phase may skip the warmup-only pass too."""

    handle: Any = None

    def single_pass_allowed_in(self, phase: str) -> bool:
        if not super().single_pass_allowed_in(phase):
            self.handle.fire()
        return True


def workspace_regrown_without_fallback(handle: FaultHandle) -> ContextManager[None]:
    return planted_policy(agreement=MovedIgnored(handle=handle))


def kv_cache_reallocated_without_recapture(handle: FaultHandle) -> ContextManager[None]:
    return planted_policy(NoRecapture(handle=handle))


def capture_outside_its_scope(handle: FaultHandle) -> ContextManager[None]:
    return planted_policy(CaptureWithoutScope(handle=handle))


def single_pass_not_agreed(handle: FaultHandle) -> ContextManager[None]:
    return planted_policy(agreement=EachRankDecides(handle=handle))


def estimation_captured_single_pass(handle: FaultHandle) -> ContextManager[None]:
    return planted_policy(SinglePassEverywhere(handle=handle))


@contextlib.contextmanager
def graph_key_ignores_sampling_variant(handle: FaultHandle) -> Iterator[None]:
    def make(graph_key):
        def planted(self, batch_size, top_k):
            handle.fire()
            # Every key gets the smallest k: a batch asking for more logprobs replays a graph
            # that ranks too few.
            return DecodeGraphKey.of(batch_size, sampling_variant(min(self.top_ks, default=None)))
        return planted

    with replace_method(DecoderGraphs, "graph_key", make):
        yield


@contextlib.contextmanager
def padding_dummy_aliases_live_blocks(handle: FaultHandle) -> Iterator[None]:
    def make(pad_decode_batch):
        def planted(spans, size):
            padded = pad_decode_batch(spans, size)
            if spans and size > len(spans):
                handle.fire()
                # The dummy rows reuse the last live sequence (its block table and length) instead
                # of the pad sink: their K/V lands in its blocks.
                dummies = (spans[-1],) * (size - len(spans))
                return PaddedDecodeBatch(tuple(spans) + dummies, padded.num_seqs, padded.num_tokens)
            return padded
        return planted

    with replace_function(graph_runner, "pad_decode_batch", make):
        yield


DECODER_FAULTS = (
    Fault(
        name="workspace-regrown-without-fallback",
        bug_class="the workspace regrows after a larger shape was captured in a single pass, and "
                  "no fallback recaptures: the earlier graph keeps the freed scratch",
        link="https://github.com/NVIDIA/TensorRT-LLM/pull/16319",
        detector="suites/decoder/test_single_pass.py::"
                 "test_a_moved_workspace_discards_the_single_pass_and_falls_back",
        expected=r"tensors moved after their single-pass capture \(\['decode\[bs=\d+,greedy\]: workspace\.tensor",
        plant=workspace_regrown_without_fallback,
    ),
    Fault(
        name="kv-cache-reallocated-without-recapture",
        bug_class="the KV cache is reallocated for phase 2 without a recapture: the graphs of the "
                  "estimation phase keep the first cache",
        link=SINGLE_PASS_PR,
        detector="suites/decoder/test_phases.py::test_phase_two_recaptures_against_the_final_kv_cache",
        expected=r"phase 1's decode graphs were not released: \['decode\[bs=",
        plant=kv_cache_reallocated_without_recapture,
    ),
    Fault(
        name="capture-outside-its-scope",
        bug_class="a decode graph is captured outside the serving scope (the communication "
                  "timeouts the graph must keep)",
        link=SINGLE_PASS_PR,
        detector="suites/decoder/test_capture_scope.py::"
                 "test_warmups_run_under_warmup_and_captures_under_serving",
        expected=r"forward \d+ \(capture\) ran under 'warmup', not 'serving'",
        plant=capture_outside_its_scope,
    ),
    Fault(
        name="graph-key-ignores-sampling-variant",
        bug_class="the decode graph key ignores the sampling variant (top-k), so a batch asking "
                  "for more logprobs replays a graph that ranks fewer",
        link="https://github.com/vllm-project/vllm/pull/36165",
        detector="suites/decoder/test_sampling_variants.py::test_graph_key_includes_the_sampling_variant",
        expected=r"the top-k list has \d+ entries, the baseline.s \d+",
        plant=graph_key_ignores_sampling_variant,
    ),
    Fault(
        name="estimation-captured-single-pass",
        bug_class="the KV-cache estimation phase is captured with the single pass (it must always "
                  "run both passes)",
        link=SINGLE_PASS_PR,
        detector="suites/decoder/test_single_pass.py::"
                 "test_single_pass_keeps_the_keys_and_runs_one_pass_in_the_final_phase",
        expected=r"capture passes per phase \{'estimate': 1",
        plant=estimation_captured_single_pass,
    ),
    Fault(
        name="single-pass-not-agreed-across-ranks",
        bug_class="the single-pass decision is each rank's own, not agreed across ranks: ranks "
                  "capture with different passes and their collectives no longer line up",
        link=SINGLE_PASS_PR,
        detector="suites/distributed/test_multirank.py::"
                 "test_a_rank_without_the_switch_keeps_both_on_two_passes[gloo-cpu]",
        expected=r"(?m)capture paths \(single pass tried, passes\) by rank: \[\(True, 1\)|did not finish within \d+ s|a rank failed:$|lined up at different decode graphs: \[",
        plant=single_pass_not_agreed,
    ),
    Fault(
        name="padding-dummy-aliases-live-blocks",
        bug_class="the padding dummy request aliases a live sequence's KV blocks instead of the "
                  "pad sink",
        link="https://github.com/NVIDIA/TensorRT-LLM/pull/13278",
        detector="suites/decoder/test_padding.py::test_the_dummy_row_writes_nothing_into_live_blocks",
        expected=r"the dummy row wrote KV slots \[(\d+[^\]]*\] of live blocks|\] of live blocks and 0 slots of the pad sink)",
        plant=padding_dummy_aliases_live_blocks,
    ),
)
