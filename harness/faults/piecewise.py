"""Faults planted in the piecewise prefill graphs (harness.runtime.piecewise).

The pool factory and the split predicate are planted through the engine's piecewise policy
(runtime/piecewise/policy.py): every engine built while the fault is planted gets a policy with the
planted part, by replacing `default_piecewise_policy`, which an engine built without a policy asks.
Bucket validation and the input copy are planted in the public functions that do them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator

from torch import fx

from harness.faults.patching import replace_default, replace_function
from harness.faults.registry import Fault, FaultHandle
from harness.graphs.base import GraphBackend
from harness.runtime.piecewise import buckets
from harness.runtime.piecewise import policy as piecewise_policy
from harness.runtime.piecewise import runner as piecewise
from harness.runtime.piecewise.policy import PoolFactory, SplitPredicate

PIECEWISE_PR = "https://github.com/NVIDIA/TensorRT-LLM/pull/11515"


def planted_policy(**parts: Callable[[], Any]) -> ContextManager[None]:
    """Every engine built without a piecewise policy gets the default one with each named part
    replaced by a new one (`parts[name]()`, so no two engines share a planted part's state)."""
    return replace_default(piecewise_policy, "default_piecewise_policy",
                           lambda default: dataclasses.replace(default, **{n: p() for n, p in parts.items()}))


@dataclass(frozen=True)
class RecyclingPools(PoolFactory):
    """Hands out the pool it handed out last, once it has one: after clear() that is a released pool."""

    handle: Any = None
    handed: list = field(default_factory=list)

    def new_pool(self, graph_backend: GraphBackend) -> Any:
        if self.handed:
            self.handle.fire()
            return self.handed[-1]
        self.handed.append(super().new_pool(graph_backend))
        return self.handed[-1]


@dataclass(frozen=True)
class AttentionKeptStatic(SplitPredicate):
    """No node is dynamic: the attention op stays inside a static segment, its metadata frozen."""

    handle: Any = None

    def __call__(self, node: fx.Node) -> bool:
        if super().__call__(node):
            self.handle.fire()
        return False


def released_pool_reused(handle: FaultHandle):
    return planted_policy(pools=lambda: RecyclingPools(handle=handle))


def attention_not_a_split_point(handle: FaultHandle):
    return planted_policy(split_at=lambda: AttentionKeptStatic(handle=handle))


@contextlib.contextmanager
def bucket_above_max_num_tokens(handle: FaultHandle) -> Iterator[None]:
    def make(validate_buckets):
        def planted(values, max_num_tokens):
            values = list(values)
            if any(isinstance(b, int) and b > max_num_tokens for b in values):
                handle.fire()
                max_num_tokens = max(values)  # the limit is not checked
            return validate_buckets(values, max_num_tokens)
        return planted

    with replace_function(buckets, "validate_buckets", make):
        yield


@contextlib.contextmanager
def piecewise_inputs_not_copied(handle: FaultHandle) -> Iterator[None]:
    def make(copy_into_static):
        def planted(static, new, *, name):
            handle.fire()  # the replay reads the inputs of the capture (or the last copy)
        return planted

    with replace_function(piecewise, "copy_into_static", make):
        yield


PIECEWISE_FAULTS = (
    Fault(
        name="released-pool-reused-at-recapture",
        bug_class="a graph pool released by clear() is handed out again at recapture",
        link="https://github.com/NVIDIA/TensorRT-LLM/pull/16952",
        detector="suites/piecewise/test_recapture.py::"
                 "test_phase_two_recaptures_into_fresh_pools_and_agrees_with_eager",
        expected=r"would record into pool .+, which clear_piecewise_graphs\(\) released",
        plant=released_pool_reused,
    ),
    Fault(
        name="attention-not-a-split-point",
        bug_class="an attention op is not a split point: it is captured inside a static segment "
                  "with its metadata frozen",
        link=PIECEWISE_PR,
        detector="suites/piecewise/test_split.py::test_the_engine_predicate_splits_at_both_attention_ops",
        expected=r"keeps \['harness\.paged_attention\S*', 'harness\.block_sparse_attention\S*'\] inside a static segment",
        plant=attention_not_a_split_point,
    ),
    Fault(
        name="bucket-above-max-num-tokens",
        bug_class="a piecewise bucket above max_num_tokens is accepted (no batch reaches it and the "
                  "metadata buffers cannot hold it)",
        link="https://github.com/NVIDIA/TensorRT-LLM/issues/10688",
        detector="suites/piecewise/test_buckets.py::"
                 "test_a_bad_bucket_is_named_with_its_limit[buckets3-piecewise bucket 300 exceeds max_num_tokens 256]",
        expected=r"piecewise buckets \[8, 300\] were accepted as \(8, 300\) with max_num_tokens 256",
        plant=bucket_above_max_num_tokens,
    ),
    Fault(
        name="piecewise-inputs-not-copied",
        bug_class="piecewise replay does not copy the dynamic inputs into the captured buffers",
        link="https://github.com/NVIDIA/TensorRT-LLM/pull/18207",
        detector="suites/piecewise/test_runner.py::test_replay_equals_eager_for_every_bucket_with_new_inputs",
        expected=r"(?i)mismatch|not close",
        plant=piecewise_inputs_not_copied,
    ),
)
