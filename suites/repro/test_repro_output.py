"""`harness repro` of a test that torch.compiles prints the test's failure, not torch's structured
trace: pytest's log capture stays off torch's trace logger in harness sessions, and torch's own
logging keeps its settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.cli import main

ROOT = Path(__file__).resolve().parents[2]

COMPILES_THEN_FAILS = '''
import logging
import torch


def test_compiles_then_fails():
    compiled = torch.compile(lambda x: x * 2, backend="eager")
    trace = logging.getLogger("torch.__trace")
    print(f"TRACE LOGGER level={trace.level} propagate={trace.propagate}")
    assert compiled(torch.ones(2)).sum().item() == 5, "a planted failure"
'''


def test_harness_repro_prints_no_torch_trace_lines(tmp_path, capsys):
    (tmp_path / "test_compiled.py").write_text(COMPILES_THEN_FAILS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider",
                           "-q", "--graph-backend=emulated", "test_compiled.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "a planted failure" in proc.stdout and "DEBUG    torch.__trace:" not in proc.stdout
    assert "TRACE LOGGER level=10 propagate=False" in proc.stdout  # torch's own settings, untouched
    (path,) = (tmp_path / "repro").glob("*.json")

    assert main(["repro", str(path)]) == 1
    out = capsys.readouterr().out
    assert "a planted failure" in out
    assert "DEBUG    " not in out and "Captured log" not in out
