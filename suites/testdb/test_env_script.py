"""scripts/env.sh, run offline against a stand-in python: it says what it installs, shows pip's error
when the CPU-only torch build is missing, and holds the fallback to the torch versions the project is tested on."""

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Creates a "venv" (a copy of itself), has no torch, finds no CPU-only build, installs the rest.
STAND_IN_PYTHON = r'''#!/usr/bin/env bash
echo "$*" >> "$STAND_IN_LOG"
case "$*" in
  "-m venv "*) mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; exit 0 ;;
  "-c import torch") exit 1 ;;
  *"install --progress-bar off torch==2.13.0+cpu")
    echo "ERROR: No matching distribution found for torch==2.13.0+cpu" >&2; exit 1 ;;
  *" install "*) echo "Successfully installed (stand-in)"; exit 0 ;;
  "-c "*) echo "torch 2.12.0"; exit 0 ;;
esac
'''


def test_env_script_shows_pips_error_and_pins_the_fallback_to_the_tested_torch(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "env.sh", tmp_path / "scripts" / "env.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    python = tmp_path / "stand-in-python"
    python.write_text(STAND_IN_PYTHON)
    python.chmod(0o755)
    log = tmp_path / "calls.log"
    env = {**os.environ, "PYTHON": str(python), "STAND_IN_LOG": str(log)}
    proc = subprocess.run(["bash", str(tmp_path / "scripts" / "env.sh"), "true"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    supported = re.search(r'^torch_spec="(torch[<>=][^"]*)"$', (ROOT / "scripts" / "env.sh").read_text(), re.M).group(1)
    assert "," in supported, f"env.sh's fallback torch requirement {supported!r} has no upper bound"
    err = proc.stderr
    assert "ERROR: No matching distribution found for torch==2.13.0+cpu" in err  # pip's own error
    assert f"installing {supported} instead" in err
    assert "[env] installing the project" in err and "[env] ready in" in err
    installs = [line for line in log.read_text().splitlines() if " install " in line]
    assert [line.rsplit(" ", 1)[-1] for line in installs] == ["torch==2.13.0+cpu", supported, f"{tmp_path}[test]"]
