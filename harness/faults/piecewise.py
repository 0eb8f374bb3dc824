"""Faults planted in the piecewise prefill graphs (harness.runtime.piecewise.runner, compile_backend, buckets)."""

from __future__ import annotations

import contextlib
from typing import Iterator

from harness.faults.patching import replace_function
from harness.faults.registry import Fault, FaultHandle
from harness.runtime.piecewise import buckets, compile_backend
from harness.runtime.piecewise import runner as piecewise

PIECEWISE_PR = "https://github.com/NVIDIA/TensorRT-LLM/pull/11515"


@contextlib.contextmanager
def released_pool_reused(handle: FaultHandle) -> Iterator[None]:
    def make(fresh_pool):
        def planted(graph_backend, released):
            if released is not None:
                handle.fire()
                return released
            return fresh_pool(graph_backend, released)
        return planted

    with replace_function(compile_backend, "fresh_pool", make):
        yield


@contextlib.contextmanager
def attention_not_a_split_point(handle: FaultHandle) -> Iterator[None]:
    def make(is_dynamic_node):
        def planted(node):
            if is_dynamic_node(node):
                handle.fire()
            return False  # the attention op stays inside a static segment, metadata frozen
        return planted

    with replace_function(compile_backend, "is_dynamic_node", make):
        yield


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
        expected=r"ReleasedPoolError|same_pool",
        plant=released_pool_reused,
    ),
    Fault(
        name="attention-not-a-split-point",
        bug_class="an attention op is not a split point: it is captured inside a static segment "
                  "with its metadata frozen",
        link=PIECEWISE_PR,
        detector="suites/piecewise/test_split.py::test_the_engine_predicate_splits_at_both_attention_ops",
        expected=r"is_dynamic_node",
        plant=attention_not_a_split_point,
    ),
    Fault(
        name="bucket-above-max-num-tokens",
        bug_class="a piecewise bucket above max_num_tokens is accepted (no batch reaches it and the "
                  "metadata buffers cannot hold it)",
        link="https://github.com/NVIDIA/TensorRT-LLM/issues/10688",
        detector="suites/piecewise/test_buckets.py::"
                 "test_a_bad_bucket_is_named_with_its_limit[buckets3-piecewise bucket 300 exceeds max_num_tokens 256]",
        expected=r"DID NOT RAISE",
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
