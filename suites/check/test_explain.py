"""harness.check.explain_divergence names the first replayed op that departs from eager, its source
line, the input that differs and why: a Python int frozen at capture, a buffer rebound since capture,
pool memory another graph took over, memory no op wrote; and it reports nothing where replay and
eager agree."""

from __future__ import annotations

import inspect
import os
import warnings

import pytest
import torch

from harness.check import explain_divergence
from harness.check.causes import BUFFER_REBOUND, HOST_VALUE_FROZEN, NEVER_WRITTEN, Cause


def _line_of(snippet: str) -> str:
    """`suites/check/test_explain.py:N` of the first line of this file holding `snippet`."""
    lines, _ = inspect.getsourcelines(inspect.getmodule(_line_of))
    number = next(i for i, line in enumerate(lines, 1) if snippet in line and "_line_of" not in line)
    return f"{os.path.relpath(__file__)}:{number}"


def _host_int_step(backend, change: bool):
    x = torch.arange(8, dtype=torch.float32)
    length = [4]
    graph = backend.capture(lambda: (x * 2)[: length[0]].sum())  # the slice length is a host int
    graph.replay()
    if change:
        length[0] = 6
    graph.replay()


def test_a_host_int_frozen_at_capture_is_named_with_its_line():
    explanation = explain_divergence(_host_int_step, True)
    assert explanation.diverged, explanation
    assert explanation.op == "aten.sum.default"
    assert explanation.where.startswith(_line_of("(x * 2)[: length[0]].sum()")), explanation.where
    assert explanation.cause.kind == HOST_VALUE_FROZEN
    assert "shape (4,) in the graph, (6,) eagerly" in explanation.cause.detail
    assert [line.op for line in explanation.before] == ["aten.mul.Tensor"]
    text = str(explanation)
    assert "first divergent op: aten.sum.default" in text and "ops before it" in text


def test_no_divergence_without_the_bug():
    explanation = explain_divergence(_host_int_step, False)
    assert not explanation.diverged, explanation
    assert explanation.replays_compared == 2 and explanation.ops_compared == 4
    assert "no replayed op departs from eager" in str(explanation)


class Weights:
    def __init__(self) -> None:
        self.scale = torch.full((8,), 2.0)


def test_a_buffer_rebound_since_capture_is_named_by_its_path():
    weights = Weights()
    kept = []

    def step(backend):
        x = torch.ones(8)
        graph = backend.capture(lambda: x * weights.scale)
        graph.replay()
        kept.append(weights.scale)  # the old buffer stays alive: the graph reads stale values
        weights.scale = torch.full((8,), 3.0)
        graph.replay()

    explanation = explain_divergence(step, roots=lambda: {"weights": weights})
    assert explanation.diverged and explanation.op == "aten.mul.Tensor", explanation
    assert explanation.where.startswith(_line_of("lambda: x * weights.scale"))
    assert explanation.argument == "other"
    assert explanation.cause.kind == BUFFER_REBOUND
    assert "where `weights.scale` was at capture; eager reads `weights.scale`" in explanation.cause.detail


def test_memory_no_op_wrote_names_its_allocation():
    def fill(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        fresh = torch.empty_like(out)
        torch.mul(x, 2, out=fresh)  # the planted bug: writes a fresh tensor, not the caller's `out`
        return fresh

    def step(backend):
        x = torch.ones(8)

        def body():
            out = torch.empty_like(x)
            fill(out, x)
            return out + 1

        graph = backend.capture(body)
        graph.replay()

    explanation = explain_divergence(step)
    assert explanation.diverged and explanation.op == "aten.add.Tensor", explanation
    assert explanation.cause.kind == NEVER_WRITTEN
    assert f"allocated by an `empty` at {_line_of('out = torch.empty_like(x)')}" in explanation.cause.detail
    assert _line_of("torch.mul(x, 2, out=fresh)") in explanation.cause.detail


def test_memory_no_op_wrote_is_located_among_agreeing_ops_of_the_same_line():
    def fill_into(out: torch.Tensor, x: torch.Tensor, planted: bool) -> None:
        torch.mul(x, 2, out=torch.empty_like(out) if planted else out)  # planted: another tensor

    def step(backend):
        x = torch.ones(8)

        def body():
            results = []
            for planted in (False, True):  # the first pass agrees, at the same lines as the second
                out = torch.empty_like(x)
                fill_into(out, x, planted)
                results.append(out + 1)
            return results

        graph = backend.capture(body)
        graph.replay()

    explanation = explain_divergence(step)
    assert explanation.diverged and not explanation.raised, explanation
    assert explanation.op == "aten.add.Tensor" and explanation.cause.kind == NEVER_WRITTEN, explanation
    assert _line_of("torch.mul(x, 2, out=torch.empty_like(out)") in explanation.cause.detail


def _pool_step(backend, release: bool):
    pool = backend.graph_pool_handle()
    x, y = torch.ones(64), torch.full((64,), 5.0)
    held = {}

    def produce():
        # Graph memory, a block of the shared pool, kept by the caller. setdefault: the eager
        # run of this capture at each explained replay must not rebind it.
        held.setdefault("t", x * 2)

    first = backend.capture(produce, pool=pool)
    first.replay()
    second = backend.capture(lambda: held["t"] + 1, pool=pool)  # reads the first graph's block
    if release:
        held["t"] = held["t"].clone()  # the planted bug: the block is released while `second` reads it
    third = backend.capture(lambda: y * 3, pool=pool)  # takes the released block, if released
    third.replay()
    second.replay()


def test_pool_memory_another_graph_took_over_is_refused_and_named():
    # The emulator refuses the replay before any op departs from eager (shared_blocks.py); the
    # cause of that name is what explain_cuda gives where the pools are CUDA's own (the graph
    # sanitizer: suites/public_bugs/test_shared_pool_block_reused_after_reset.py).
    assert not explain_divergence(_pool_step, False).diverged
    explanation = explain_divergence(_pool_step, True)
    assert not explanation.diverged, explanation
    assert "reads pool memory overwritten by another graph" in explanation.raised
    assert _line_of('lambda: held["t"] + 1') in explanation.raised
    assert _line_of("lambda: y * 3") in explanation.raised


def test_a_classifier_given_by_the_caller_is_consulted_first():
    race = Cause("a race under the adversarial schedule", "planted by the test")
    explanation = explain_divergence(_host_int_step, True, classifiers=[lambda pair, ctx: race])
    assert explanation.cause == race


def test_an_error_of_the_step_is_reported_with_its_diagnosis():
    def step(backend):
        x = torch.ones(8)
        holder = {"w": torch.full((8,), 2.0)}
        graph = backend.capture(lambda: x * holder["w"])
        holder["w"] = torch.full((8,), 3.0)  # the captured buffer is freed: the emulator refuses
        graph.replay()

    explanation = explain_divergence(step)
    assert not explanation.diverged and explanation.raised.startswith(
        "harness.graphs.base.FreedMemoryError: replay() of a graph whose memory was freed"), explanation
    assert str(explanation).startswith("no replayed op departed from eager before the step raised")


def test_bad_arguments_are_refused_with_their_limits():
    with pytest.raises(ValueError, match="steps must be >= 0"):
        explain_divergence(_host_int_step, False, steps=-1)
    with pytest.raises(TypeError, match="requests= needs step"):
        explain_divergence(lambda backend: None, requests=[])


def _explain_tiny_transformers(model_type: str, class_name: str):
    from harness.adapters.transformers import TransformersRuntime
    from harness.audit.classify import MAX_CACHE_LEN, PROMPTS, requests
    from harness.audit.tiny import Architecture, build_tiny

    model = build_tiny(Architecture(model_type, class_name), torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return explain_divergence(
            lambda backend: TransformersRuntime(model, backend=backend, graph_sizes=(len(PROMPTS),),
                                                max_cache_len=MAX_CACHE_LEN),
            requests=requests())


def test_the_sliding_window_mask_from_a_frozen_python_int_is_named():
    explanation = _explain_tiny_transformers("mistral", "MistralForCausalLM")
    assert explanation.diverged, explanation
    assert "transformers/masking_utils.py" in explanation.where, explanation
    assert explanation.cause.kind == HOST_VALUE_FROZEN, explanation
    assert "the value it had at capture" in explanation.cause.detail

@pytest.mark.slow
def test_piecewise_and_decode_graphs_of_the_engine_agree_with_eager_op_by_op():
    from harness.repro.explain import explain_scenario
    from harness.repro.fault_cases import fault_record

    scenario = fault_record("piecewise-inputs-not-copied").scenario  # piecewise buckets and a decode graph
    explanation = explain_scenario(scenario)
    assert not explanation.diverged and not explanation.raised, explanation
    assert explanation.replays_compared > 10 and explanation.unmatched_ops == 0, explanation


@pytest.mark.slow
def test_a_full_attention_transformers_model_agrees_with_eager_op_by_op():
    explanation = _explain_tiny_transformers("llama", "LlamaForCausalLM")
    assert not explanation.diverged and explanation.ops_compared > 100, explanation


def _one_graph_replayed_twice(backend):
    x = torch.arange(4, dtype=torch.float32)
    graph = backend.capture(lambda: x * 2)
    graph.replay()
    graph.replay()


def test_a_check_before_the_replay_reports_what_the_eager_run_would_share():
    from harness.check.explain import Explanation

    seen = []

    def second_replay_is_wrong(graph):
        seen.append(graph.replays)
        if graph.replays < 2:
            return None
        return Explanation(True, 0, 0, op="host decision", where="here",
                           cause=Cause("a cause the eager run shares", "the detail"))

    explanation = explain_divergence(_one_graph_replayed_twice, checks=(second_replay_is_wrong,))
    assert seen == [1, 2]
    assert explanation.diverged and explanation.op == "host decision", explanation
    assert explanation.graph.endswith("replay 2") and explanation.replays_compared == 1
    assert "differs: a cause the eager run shares\n    the detail" in str(explanation)
    assert not explain_divergence(_one_graph_replayed_twice, checks=(lambda graph: None,)).diverged


def test_the_eager_log_zeroes_what_an_empty_makes():
    from harness.check.oplog import EagerOpLog

    for _ in range(3):  # freed memory of the same size, full of sevens, is what the next empty gets
        del_me = torch.full((16384,), 7.0)
        del del_me
        with EagerOpLog():
            made = torch.empty(16384)
        assert bool((made == 0).all())
