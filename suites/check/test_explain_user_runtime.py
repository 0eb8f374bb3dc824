"""`explain_against_eager` and `harness explain FILE.py::FUNCTION` on code the project did not
write: a small nano-vllm-shaped runtime written against torch.cuda only (user_paged_runtime.py),
padded to its graph's batch, with static buffers wider than eager's; and user code that races,
raises, or runs under a schedule explain cannot observe."""

from __future__ import annotations

import contextlib
import re
import textwrap
from pathlib import Path

import pytest
import torch

import harness
from harness import cli
from harness.check.causes import PADDING_ALIASES
from harness.check.explain_cuda import ReplaysNotObserved, explain_against_eager
from harness.emulation import emulation_active
from harness.repro.explain import load_entry_point

RUNTIME = Path(__file__).with_name("user_paged_runtime.py")


def _on_the_emulated_device(**options):
    """`harness.emulate_cuda(device="cpu")`, or the session's own under `--emulate-cuda`; on a
    machine with a GPU the test is skipped (the GPU's test is below)."""
    if emulation_active() == "cpu" and not options:
        return contextlib.nullcontext()
    if emulation_active() is not None or torch.cuda.is_available():
        pytest.skip("the emulated CUDA device is checked without a GPU")
    return harness.emulate_cuda(device="cpu", **options)


def _explain(function: str, **options):
    with _on_the_emulated_device(**options):
        run = load_entry_point(f"{RUNTIME}::{function}")
        return explain_against_eager(lambda: run(graphed=True), lambda: run(graphed=False))


def _line(snippet: str) -> str:
    lines = RUNTIME.read_text().splitlines()
    return next(f"{RUNTIME.name}:{i}: {line.strip()}" for i, line in enumerate(lines, 1) if snippet in line)


@pytest.mark.explains_against_eager
def test_a_padded_batch_and_a_wider_static_block_table_are_no_divergence():
    explanation = _explain("run")
    assert not explanation.diverged and not explanation.raised, explanation
    assert explanation.replays_compared == 3 and explanation.ops_compared > 60, explanation


@pytest.mark.explains_against_eager
def test_padding_rows_written_to_a_live_slot_are_named_at_the_write():
    explanation = _explain("run_padding_bug")
    assert explanation.diverged and explanation.op == "aten.index_copy_.default", explanation
    assert explanation.where.endswith(_line("self.k_cache.index_copy_(0, slots, k)")), explanation.where
    assert explanation.graph == "graph 1, replay 1", explanation
    assert explanation.argument == "index" and explanation.cause.kind == PADDING_ALIASES, explanation
    assert "its padding rows [3:4] hold [0]" in explanation.cause.detail, explanation.cause.detail


@pytest.mark.explains_against_eager
def test_the_harness_ranking_of_a_padded_and_an_unpadded_batch_agrees():
    # The lm head's 4-row and 3-row matmuls round apart by an ulp; logits_to_steps turns the logits'
    # bits into exact int64 keys, which must not count as a divergence.
    explanation = _explain("run_ranked")
    assert not explanation.diverged and not explanation.raised, explanation
    assert explanation.replays_compared == 3, explanation


@pytest.mark.explains_against_eager
def test_the_op_log_is_not_device_memory():
    explanation = _explain("run_checks_free_memory")
    assert not explanation.raised and not explanation.diverged, explanation
    assert explanation.replays_compared == 3, explanation


def _user_file(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "user_code.py"
    path.write_text(textwrap.dedent(source))
    return path


def _line_in(path: Path, snippet: str) -> str:
    lines = path.read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if snippet in line)
    return f"{path}:{number}: {lines[number - 1].strip()}"


@pytest.mark.explains_against_eager
def test_an_eager_run_that_raises_is_reported_with_its_type_message_and_line(tmp_path):
    path = _user_file(tmp_path, """
        import torch
        def run(graphed):
            x = torch.ones(4, device="cuda")
            if not graphed:
                assert float(x.sum()) == 5.0
    """)
    with _on_the_emulated_device():
        run = load_entry_point(f"{path}::run")
        explanation = explain_against_eager(lambda: run(graphed=True), lambda: run(graphed=False))
    assert explanation.raised.startswith("the eager run raised builtins.AssertionError: (no message)")
    assert _line_in(path, "assert float(x.sum()) == 5.0") in explanation.raised, explanation.raised


@pytest.mark.explains_against_eager
def test_a_race_under_explain_names_the_users_line(tmp_path):
    path = _user_file(tmp_path, """
        import torch
        def run(graphed):
            x = torch.ones(1024, device="cuda")
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                y = x * 2
            del x  # freed on its stream while the side stream's read may still be running
            z = torch.zeros(1024, device="cuda")  # the stream's next allocation takes x's block
            torch.cuda.current_stream().wait_stream(side)
            return y + z
    """)
    with _on_the_emulated_device():
        run = load_entry_point(f"{path}::run")
        explanation = explain_against_eager(lambda: run(graphed=True), lambda: run(graphed=False))
    assert "RaceError" in explanation.raised and "memory freed while" in explanation.raised, explanation
    # Both accesses at the user's lines: the op log that ran the read is not the user's code. The
    # side stream's number depends on the streams made before it (a session's device keeps them).
    read = re.search(rf"reads it on stream (\d+) at {re.escape(_line_in(path, 'y = x * 2'))}", explanation.raised)
    assert read is not None and read.group(1) != "0", explanation.raised
    assert f"on stream 0 at {_line_in(path, 'del x')}" in explanation.raised, explanation.raised
    assert f"on stream 0 at {_line_in(path, 'z = torch.zeros(1024')}" in explanation.raised, explanation.raised
    assert f"raised at {_line_in(path, 'z = torch.zeros(1024')}" in explanation.raised, explanation.raised
    assert "harness/check" not in explanation.raised, explanation.raised


def test_the_adversarial_schedule_is_refused_for_want_of_observed_replays():
    with pytest.raises(ReplaysNotObserved, match=r"schedule='adversarial'.*accepted: schedule='issue_order'"):
        _explain("run", schedule="adversarial")


@pytest.mark.explains_against_eager
def test_harness_explain_takes_a_users_file_and_function(capsys):
    # Enters emulate_cuda() itself, or reuses the session's under --emulate-cuda.
    before = emulation_active()
    if before != "cpu" and torch.cuda.is_available():
        pytest.skip("the emulated CUDA device is checked without a GPU")
    assert cli.main(["explain", f"{RUNTIME}::run_padding_bug"]) == 1
    out = capsys.readouterr().out
    assert "first divergent op: aten.index_copy_.default" in out and PADDING_ALIASES in out, out
    assert _line("self.k_cache.index_copy_(0, slots, k)") in out
    assert cli.main(["explain", f"{RUNTIME}::run"]) == 0
    assert "no replayed op departs from eager" in capsys.readouterr().out
    assert emulation_active() == before  # left its own emulation, kept the session's


@pytest.mark.parametrize("target, message", [
    ("{runtime}", "expected FILE.py::FUNCTION"),
    ("{runtime}::nowhere", "has no function 'nowhere'; its functions: decode, run, "),
    ("{runtime}::decode", "decode must take graphed=True|False"),
    ("missing.py::run", "no file missing.py"),
])
def test_harness_explain_names_what_is_wrong_with_a_target(capsys, target, message):
    assert cli.main(["explain", target.format(runtime=RUNTIME)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.gpu
def test_explain_runs_the_graphed_callable_under_the_graph_sanitizer():
    # torch.cuda.is_available() holds on the emulated device too: only the sanitizer's own kind
    # ("cuda", the session's under --emulate-cuda on a GPU) or no emulation over a real GPU will do.
    if emulation_active() == "cpu" or (emulation_active() is None and not torch.cuda.is_available()):
        pytest.skip("the graph sanitizer needs a real GPU")
    with contextlib.nullcontext() if emulation_active() == "cuda" else harness.emulate_cuda():
        assert emulation_active() == "cuda"
        clean = explain_against_eager(*_both("run"))
        planted = explain_against_eager(*_both("run_padding_bug"))
    assert not clean.diverged and not clean.raised and clean.replays_compared == 3, clean
    # CUDA's index_copy_ leaves the order of a duplicate slot's writes open: the padding row's
    # write shows at the write or where the slot is read next.
    assert planted.diverged and planted.op in ("aten.index_copy_.default", "aten.index.Tensor"), planted
    assert RUNTIME.name in planted.where and not planted.raised, planted


def _both(function: str):
    run = load_entry_point(f"{RUNTIME}::{function}")
    return (lambda: run(graphed=True)), (lambda: run(graphed=False))
