#!/usr/bin/env bash
# Creates .venv (once) with torch, the project and its test dependencies, then runs "$@" inside it.
# Prefers the CPU-only torch build where pip can find one: it is a tenth of the download. Any other
# torch it installs is held to the versions the project is tested on.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
py="${PYTHON:-python3}"
stamp="$venv/.installed"
cpu_torch="torch==2.13.0+cpu"
# The torch range this project is tested on, the same as pyproject.toml declares: 2.11 (the CUDA
# wheel on the GPU machine), 2.13 (the CPU wheel, CI), 2.14.1 and 2.15.0 (CUDA wheels without a GPU).
# suites/cuda_device/test_builds.py holds the two ranges equal.
torch_spec="torch>=2.11,<2.16"

pip_install() {
  # pip's own lines, less the ones about what is already there; its errors stay visible.
  "$venv/bin/python" -m pip --disable-pip-version-check install --progress-bar off "$@" 2>&1 \
    | { grep -v -e "^Requirement already satisfied" -e "^WARNING: Location .* is ignored" || true; }
}

if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  started=$SECONDS
  echo "[env] setting up $venv" >&2
  [ -x "$venv/bin/python" ] || { echo "[env] creating the venv with $py" >&2; "$py" -m venv "$venv"; }
  if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "[env] installing $cpu_torch (the CPU-only build)" >&2
    if ! pip_install "$cpu_torch" >&2; then
      echo "[env] pip found no $cpu_torch (its error is above); installing $torch_spec instead" >&2
      pip_install "$torch_spec" >&2
    fi
  fi
  echo "[env] installing the project (editable, with the test extra) and its dependencies" >&2
  pip_install -e "$root[test]" >&2
  touch "$stamp"
  echo "[env] ready in $((SECONDS - started)) s: $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)')" >&2
fi
export PATH="$venv/bin:$PATH"
exec "$@"
