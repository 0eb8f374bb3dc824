"""`harness audit transformers --emulate-cuda`: each architecture's process enters emulate_cuda(),
its model lives on "cuda" (the emulated device) and its decode step is captured through
torch.cuda.graph. The mode is in the provenance and a column of its own in `audit merge`."""

from __future__ import annotations

import io

import pytest

from harness import cli
from harness.audit.classify import AGREES, CAPTURE_ERROR, Row
from harness.audit.report import column_label, render_markdown
from harness.audit.runner import AuditResult, run_audit, select


@pytest.fixture(scope="module")
def audit_on_the_device():
    return run_audit(select(["opt", "olmoe"]), dtype="bfloat16", backend="emulated", jobs=2,
                     progress=io.StringIO(), emulate_cuda=True)


# opt reads the cache length on the host; olmoe's grouped MoE takes transformers' cuda path
# (an integer histc, which the CPU build lacks) and must still agree.
@pytest.mark.parametrize("model_type, verdict", [("opt", CAPTURE_ERROR), ("olmoe", AGREES)])
def test_each_architecture_runs_on_the_emulated_device(audit_on_the_device, model_type, verdict):
    row = {r.model_type: r for r in audit_on_the_device.rows}[model_type]
    assert row.verdict == verdict, row
    if verdict == CAPTURE_ERROR:
        assert "models/opt/modeling_opt.py" in row.detail, row


def test_the_mode_is_in_the_provenance_and_its_own_merge_column(audit_on_the_device, tmp_path):
    meta = audit_on_the_device.meta
    assert meta["emulate_cuda"] is True and meta["backend"] == "emulated"
    assert column_label(audit_on_the_device) == "emulate_cuda bfloat16"
    plain = AuditResult({"backend": "emulated", "dtype": "bfloat16", "emulate_cuda": False},
                        [Row("opt", "OPTForCausalLM", "bfloat16", "emulated", CAPTURE_ERROR, "sync")])
    table = render_markdown([plain, audit_on_the_device])
    assert "| architecture | class | emulated bfloat16 | emulate_cuda bfloat16 | differs |" in table
    assert "inside harness.emulate_cuda()" in table


def test_bad_combinations_are_refused(tmp_path, capsys):
    assert cli.main(["audit", "transformers", "--emulate-cuda", "--graph-backend", "cuda",
                     "--arch", "llama"]) == 2
    assert "accepted: auto or emulated" in capsys.readouterr().err
    plain = AuditResult({"backend": "emulated", "dtype": "float32", "emulate_cuda": False},
                        [Row("llama", "LlamaForCausalLM", "float32", "emulated", AGREES)])
    plain.save(tmp_path / "plain.json")
    assert cli.main(["audit", "transformers", "--emulate-cuda", "--dtype", "float32", "--arch", "llama",
                     "--arch", "qwen2", "--resume", str(tmp_path / "plain.json")]) == 2
    assert "resume in the same mode" in capsys.readouterr().err
