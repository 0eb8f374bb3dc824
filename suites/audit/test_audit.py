"""The transformers capture audit classifies what it finds: a full-attention model agrees, a
sliding-window model diverges at the first replayed step (its fill level is a Python int frozen at
capture), a model with a host sync is a capture error; a crashing architecture costs one row."""

from __future__ import annotations

import io
import multiprocessing
import os

import pytest

from harness import cli
from harness.audit import runner
from harness.audit.classify import AGREES, CAPTURE_ERROR, CRASHED, DIVERGES, Row
from harness.audit.report import differing, render_markdown
from harness.audit.runner import AuditResult, run_audit, select


@pytest.fixture(scope="module")
def small_audit(graph_backend):
    progress = io.StringIO()
    result = run_audit(select(["llama", "mistral", "opt"]), dtype="bfloat16", backend=graph_backend.name,
                       jobs=2, progress=progress)
    return result, progress.getvalue()


def test_small_audit_classifies_each_kind(small_audit, graph_backend):
    result, progress = small_audit
    rows = {r.model_type: r for r in result.rows}
    assert rows["llama"].verdict == AGREES, rows["llama"]
    assert (rows["mistral"].verdict, rows["mistral"].step) == (DIVERGES, 1), rows["mistral"]
    assert "decode[bs=2,greedy]" in rows["mistral"].detail
    assert rows["opt"].verdict == CAPTURE_ERROR, rows["opt"]
    if graph_backend.name == "emulated":
        assert "models/opt/modeling_opt.py" in rows["opt"].detail, rows["opt"]
    assert progress.count("\n") == 3 and "[3/3]" in progress
    assert result.meta["backend"] == graph_backend.name and result.meta["transformers"]


def test_a_crashing_architecture_costs_one_row(monkeypatch):
    real = runner.audit_architecture

    def crash_on_llama(arch, dtype, backend):
        if arch.model_type == "llama":
            os._exit(3)
        return real(arch, dtype, backend)

    monkeypatch.setattr(runner, "audit_architecture", crash_on_llama)  # forked children inherit it
    result = run_audit(select(["llama", "qwen2"]), dtype="float32", backend="emulated", jobs=2, progress=None)
    verdicts = {r.model_type: r.verdict for r in result.rows}
    assert verdicts == {"llama": CRASHED, "qwen2": AGREES}
    assert "exit status 3" in result.rows[0].detail


def _result(backend: str, verdicts: dict[str, tuple[str, int | None]]) -> AuditResult:
    return AuditResult({"backend": backend, "dtype": "bfloat16", "commit": "abc"},
                       [Row(t, t.title(), "bfloat16", backend, v, "why" if v != AGREES else "", s)
                        for t, (v, s) in verdicts.items()])


def test_merge_puts_columns_side_by_side_and_marks_differences(tmp_path, capsys):
    cpu = _result("emulated", {"llama": (AGREES, None), "mistral": (DIVERGES, 1), "bert": (CAPTURE_ERROR, None)})
    cuda = _result("cuda", {"llama": (AGREES, None), "mistral": (DIVERGES, 1), "bert": (AGREES, None)})
    assert differing([cpu, cuda]) == ["bert"]
    table = render_markdown([cpu, cuda])
    assert "| architecture | class | emulated bfloat16 | cuda bfloat16 | differs |" in table
    assert "| bert | `Bert` | capture error | agrees | **yes** |" in table
    assert "| mistral | `Mistral` | diverges at step 1 | diverges at step 1 |  |" in table
    cpu.save(tmp_path / "cpu.json")
    cuda.save(tmp_path / "cuda.json")
    assert cli.main(["audit", "merge", str(tmp_path / "cpu.json"), str(tmp_path / "cuda.json"), "--markdown"]) == 0
    assert "| bert | `Bert` | capture error | agrees | **yes** |" in capsys.readouterr().out


def test_an_unknown_architecture_pattern_is_refused(capsys):
    with pytest.raises(ValueError, match="'no-such-model' matches no causal LM"):
        select(["no-such-model"])
    assert cli.main(["audit", "transformers", "--arch", "no-such-model"]) == 2


@pytest.mark.slow
def test_full_audit(graph_backend, tmp_path):
    """Every causal LM architecture of transformers (nightly): at least 40 build tiny and agree, and
    the sliding-window models named in docs/design.md ("Runtimes we did not write") diverge."""
    result = run_audit(select(None), dtype="bfloat16", backend=graph_backend.name, jobs=os.cpu_count() or 2)
    result.save(tmp_path / "audit.json")
    rows = {r.model_type: r for r in result.rows}
    assert sum(r.verdict == AGREES for r in result.rows) >= 40, render_markdown([result])
    for model_type in ("mistral", "gemma2", "llama4_text"):
        assert rows[model_type].verdict == DIVERGES, rows[model_type]


def test_a_terminated_audit_keeps_its_rows_and_resumes(tmp_path):
    """SIGTERM (what `timeout` sends) after the first row: the JSON holds that row, marked
    incomplete with how many were left; --resume then runs only the rest."""
    import json
    import signal
    import subprocess
    import sys

    partial, full = tmp_path / "partial.json", tmp_path / "full.json"
    command = [sys.executable, "-m", "harness.cli", "audit", "transformers", "--graph-backend", "emulated",
               "--dtype", "float32", "-j", "1", "--arch", "llama", "--arch", "qwen2", "--arch", "mistral"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    audit = subprocess.Popen(command + ["--json", str(partial)], stderr=subprocess.PIPE, text=True, env=env)
    for line in audit.stderr:
        if line.startswith("[1/3]"):
            audit.send_signal(signal.SIGTERM)
            break
    rest = audit.stderr.read()
    assert audit.wait(60) == 130, rest
    assert "architectures left" in rest
    saved = json.loads(partial.read_text())
    assert saved["meta"]["complete"] is False
    assert saved["meta"]["total"] == 3
    assert saved["meta"]["remaining"] == 3 - len(saved["rows"]) >= 1
    assert saved["rows"][0]["verdict"] == AGREES
    done = {r["model_type"] for r in saved["rows"]}

    resumed = subprocess.run(command + ["--resume", str(partial), "--json", str(full)], capture_output=True,
                             text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    final = json.loads(full.read_text())
    assert final["meta"]["complete"] is True and final["meta"]["remaining"] == 0
    assert final["meta"]["resumed"] == len(done)
    assert [r["model_type"] for r in final["rows"]] == ["llama", "qwen2", "mistral"]
    assert resumed.stderr.count("] ") == 3 - len(done)  # progress lines only for the rows it ran
    earlier = final["meta"]["resumed_from"]
    assert [e["date"] for e in earlier] == [saved["meta"]["date"]]
    table = render_markdown([AuditResult.from_dict(final)])
    assert f"{len(done)} of the rows kept from earlier runs ({saved['meta']['date']}, commit" in table


def test_a_refused_fork_falls_back_to_spawn_and_says_so(monkeypatch):
    def refuse_fork(child):
        raise RuntimeError("os.fork is unsafe while filelock is changing descriptor ownership")

    # What filelock's fork-safety check does to a forked child's start; spawned children start.
    monkeypatch.setattr(multiprocessing.context.ForkProcess, "start", refuse_fork)
    progress = io.StringIO()
    result = run_audit(select(["llama"]), dtype="float32", backend="emulated", jobs=1, progress=progress)
    assert [r.verdict for r in result.rows] == [AGREES], result.rows
    assert result.meta["start_method_fallbacks"] == 1
    assert "llama: fork refused (os.fork is unsafe" in progress.getvalue()
    assert "1 architectures ran in spawned instead of forked children" in progress.getvalue()


def test_state_space_mixers_are_made_tiny_too():
    # At transformers' defaults (128 heads x 256 states, 256-token chunks) a hybrid's Mamba mixer
    # took minutes and was killed for memory on the 2-core CPU; an attention-only config must not
    # gain keys such as `chunk_size`, which mean other things there.
    from harness.audit.tiny import tiny_config

    hybrid = tiny_config("bamba")
    assert (hybrid.mamba_n_heads, hybrid.mamba_d_head, hybrid.mamba_d_state, hybrid.mamba_chunk_size) \
        == (8, 16, 16, 16)
    assert hybrid.mamba_n_heads * hybrid.mamba_d_head == hybrid.mamba_expand * hybrid.hidden_size
    dense = tiny_config("llama")
    assert not hasattr(dense, "chunk_size") and not hasattr(dense, "mamba_n_heads")
