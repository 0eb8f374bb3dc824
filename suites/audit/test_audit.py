"""The transformers capture audit classifies what it finds: a full-attention model agrees, a
sliding-window model diverges at the first replayed step (its fill level is a Python int frozen at
capture), a model with a host sync is a capture error; a crashing architecture costs one row."""

from __future__ import annotations

import io
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
    assert "decode(batch=2)" in rows["mistral"].detail
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
    the sliding-window models named in DESIGN.md diverge."""
    result = run_audit(select(None), dtype="bfloat16", backend=graph_backend.name, jobs=os.cpu_count() or 2)
    result.save(tmp_path / "audit.json")
    rows = {r.model_type: r for r in result.rows}
    assert sum(r.verdict == AGREES for r in result.rows) >= 40, render_markdown([result])
    for model_type in ("mistral", "gemma2", "llama4_text"):
        assert rows[model_type].verdict == DIVERGES, rows[model_type]
