"""`harness explain` of each diverging fault's reproduction file names the op and the line of the
planted bug (docs/faults.md, "Explained"), and finds nothing without the fault. Faults whose bug is
in what the host hands the graph (the padding fed to it, the inputs not copied into it, the key that
picks it) are found by the checks before the replay (harness/repro/replay_checks.py); the cause
names the planted line."""

from __future__ import annotations

import inspect
import json
import os

import pytest

import harness.faults.decoder
import harness.faults.ops
import harness.faults.piecewise
import harness.model.llama
import harness.model.rope
import harness.ops.attention
from harness import cli
from harness.check.causes import (BUFFER_REBOUND, HOST_VALUE_FROZEN, NEVER_WRITTEN, PADDING_ALIASES,
                                  STATIC_INPUT_STALE, WRONG_GRAPH_KEY)
from harness.repro import write_record
from harness.repro.fault_cases import DIVERGING, fault_record


def line_of(module, snippet: str) -> str:
    """`path:N` (as explain prints it) of the first line of `module` holding `snippet`."""
    lines, _ = inspect.getsourcelines(module)
    number = next(i for i, line in enumerate(lines, 1) if snippet in line)
    return f"{os.path.relpath(inspect.getsourcefile(module))}:{number}"


# fault -> (first divergent op, where it is issued, cause, a text the cause names: the planted line or
# the buffer the fault rebinds)
NAMED = {
    "max-seq-len-baked": ("harness.paged_attention.default",
                          lambda: line_of(harness.faults.ops, "attention.paged_attention_op(q, k, v"),
                          HOST_VALUE_FROZEN, lambda: "`block_tables` has shape"),
    "metadata-rebound": ("aten.index_select.default",
                         lambda: line_of(harness.model.rope, "self.table.index_select(0, positions)"),
                         BUFFER_REBOUND,
                         lambda: "where `metadata.positions` was at capture; eager reads `metadata.positions`"),
    "attention-returns-new-tensor": ("aten.addmm_.default",
                                     lambda: line_of(harness.model.llama, "out = residual.addmm_(x, linear.weight.t())"),
                                     NEVER_WRITTEN,
                                     lambda: line_of(harness.faults.ops, "metadata, scale, fresh, workspace")),
    "padding-dummy-aliases-live-blocks": ("harness.paged_attention.default",
                                          lambda: line_of(harness.ops.attention, "paged_attention_op(q, k, v, kv_layer, *metadata.op_inputs()"),
                                          PADDING_ALIASES,
                                          lambda: "the padding was made at " + line_of(
                                              harness.faults.decoder, "return PaddedDecodeBatch(tuple(spans) + dummies")),
    "graph-key-ignores-sampling-variant": ("DecoderGraphs.graph_key (host)",
                                           lambda: line_of(harness.faults.decoder, "sampling_variant(min(self.top_ks"),
                                           WRONG_GRAPH_KEY,
                                           lambda: "chose decode[bs=8,top2] for a batch of 8 rows asking for "
                                                   "top-4 logprobs, which needs decode[bs=8,top4]"),
    # The first op reading the stale input runs in dynamo's generated code: named by the model line
    # its node was traced from; the cause names the input, the place the copy belongs and the planted line.
    "piecewise-inputs-not-copied": ("aten.index_select.default",
                                    lambda: line_of(harness.model.rope, "self.table.index_select(0, positions)"),
                                    STATIC_INPUT_STALE,
                                    lambda: "returned at " + line_of(harness.faults.piecewise,
                                                                     "handle.fire()  # the replay reads the inputs")),
}
FAST = "max-seq-len-baked"


def test_every_diverging_fault_is_expected_here():
    assert sorted(DIVERGING) == sorted(NAMED)


def explain(tmp_path, capsys, name: str, *extra: str) -> tuple[int, str, dict]:
    path = write_record(fault_record(name), tmp_path)
    code = cli.main(["explain", str(path), *extra])
    return code, capsys.readouterr().out, json.loads(path.read_text())


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == FAST else pytest.mark.slow)
                                  for n in NAMED])
def test_explain_names_the_op_and_line_of_the_planted_bug(tmp_path, capsys, name):
    op, where, cause, named = NAMED[name]
    code, out, data = explain(tmp_path, capsys, name)
    assert data["explain"] == f"harness explain {tmp_path / (data['node_id'].replace(':', '_') + '.json')}"
    assert code == 1, out
    assert f"first divergent op: {op}\n  at {where()}" in out, out
    assert f"differs: {cause}" in out, out
    assert named() in out, out


def _without_a_gpu_or_emulation() -> None:
    """`--emulate-cuda` enters the emulated device: not inside one already (a `--emulate-cuda`
    session), nor on a machine with a GPU (where it would be the graph sanitizer)."""
    import torch

    from harness.emulation import emulation_active

    if emulation_active() is not None or torch.cuda.is_available():
        pytest.skip("explain --emulate-cuda is checked on the emulated device, outside any emulation")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(NAMED))
def test_explain_on_the_emulated_cuda_device_names_the_same_op_and_line(tmp_path, capsys, name):
    _without_a_gpu_or_emulation()
    op, where, cause, named = NAMED[name]
    code, out, _ = explain(tmp_path, capsys, name, "--emulate-cuda")
    assert code == 1, out
    assert f"first divergent op: {op}\n  at {where()}" in out, out
    assert f"differs: {cause}" in out and named() in out, out


def test_without_the_fault_no_op_departs(tmp_path, capsys):
    code, out, _ = explain(tmp_path, capsys, FAST, "--without-fault")
    assert code == 0 and "no replayed op departs from eager beyond 0 bf16 steps" in out, out


HOST_DECISIONS = ("padding-dummy-aliases-live-blocks", "graph-key-ignores-sampling-variant",
                  "piecewise-inputs-not-copied")


@pytest.mark.slow
@pytest.mark.parametrize("name", HOST_DECISIONS)
def test_the_checks_before_a_replay_find_nothing_without_the_fault(tmp_path, capsys, name):
    code, out, _ = explain(tmp_path, capsys, name, "--without-fault")
    assert code == 0 and "no replayed op departs from eager beyond 0 bf16 steps" in out, out


def test_a_file_without_a_scenario_is_refused_by_name(tmp_path, capsys):
    from dataclasses import replace

    path = write_record(replace(fault_record(FAST), scenario=None), tmp_path)
    assert cli.main(["explain", str(path)]) == 2
    assert "carries no engine scenario to explain" in capsys.readouterr().err


@pytest.mark.slow
def test_explain_with_emulate_cuda_runs_the_engine_on_the_emulated_device(tmp_path, capsys):
    _without_a_gpu_or_emulation()
    import harness
    from harness.repro.explain import explain_file

    op, where, cause, _ = NAMED[FAST]
    path = write_record(fault_record(FAST), tmp_path)
    assert cli.main(["explain", str(path), "--emulate-cuda"]) == 1
    out = capsys.readouterr().out
    assert f"first divergent op: {op}\n  at {where()}" in out and f"differs: {cause}" in out, out

    captured = []

    class Captures:
        def on_capture_begin(self, graph, stream, mode):
            captured.append(graph)

    with harness.emulate_cuda() as device, device.observe(Captures()):
        explanation = explain_file(path)
    assert captured, "no graph was captured through torch.cuda on the emulated device"
    assert explanation.diverged and explanation.where.startswith(where()), explanation
