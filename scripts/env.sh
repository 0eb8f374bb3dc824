#!/usr/bin/env bash
# Creates .venv (once) with torch, the project and its test dependencies, then runs "$@" inside it.
# Prefers the CPU-only torch build where pip can find one: it is a tenth of the download.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
py="${PYTHON:-python3}"
stamp="$venv/.installed"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  echo "[env] setting up $venv" >&2
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
  if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    if ! "${pip[@]}" install "torch==2.13.0+cpu" 2>/dev/null; then
      echo "[env] no CPU-only torch build (torch==2.13.0+cpu) where pip looks; installing the plain torch wheel" >&2
      "${pip[@]}" install torch
    fi
  fi
  "${pip[@]}" install -e "$root[test]"
  touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
exec "$@"
