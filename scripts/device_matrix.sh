#!/usr/bin/env bash
# The emulated device's suites on every torch build this machine has, with any GPU hidden: the CPU
# wheel, and the CUDA wheel on a machine without a GPU (what `pip install torch` gives a Linux CI
# runner). One line per build with its pass/fail counts; JUnit XML and logs in ${OUT:-results/matrix}.
#
#   scripts/device_matrix.sh                       # this checkout's .venv
#   scripts/device_matrix.sh /path/to/venv ...     # those venvs instead (a venv dir or its python)
#   JOBS=4 scripts/device_matrix.sh ...            # pytest-xdist workers per run (default 2; 0: none)
#
# Suites: suites/graphs, suites/cuda_device, suites/streams (not slow), and examples/cuda_runtime
# under --emulate-cuda. A venv need not have the harness installed: this checkout goes first on
# PYTHONPATH. Exit status: 0 when every build passed, 1 otherwise.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-$root/results/matrix}"
jobs="${JOBS:-2}"
mkdir -p "$out"

builds=("$@")
if [ ${#builds[@]} -eq 0 ]; then
  builds=("$root/.venv")
fi

python_of() {  # a venv directory or a python executable, as an absolute path (the runs cd)
  local py
  if [ -x "$1/bin/python" ]; then py="$1/bin/python"; elif [ -x "$1" ]; then py="$1"; else return 1; fi
  case $py in /*) echo "$py" ;; *) echo "$(cd "$(dirname "$py")" && pwd)/$(basename "$py")" ;; esac
}

counts() {  # passed failed skipped errors of a JUnit XML file
  "$py" - "$1" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print("0 0 0 1"); sys.exit()
suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
t = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
print(t["tests"] - t["failures"] - t["errors"] - t["skipped"], t["failures"], t["skipped"], t["errors"])
PY
}

status=0
summary=()
for build in "${builds[@]}"; do
  if ! py="$(python_of "$build")"; then
    summary+=("$build: no python there"); status=1; continue
  fi
  label="$("$py" -c 'import torch; print(f"torch {torch.__version__} (cuda {torch.version.cuda})")' 2>/dev/null)" \
    || { summary+=("$build: torch does not import"); status=1; continue; }
  tag="$(echo "$label" | tr -c 'A-Za-z0-9.\n' '_' | tr -s '_')"
  xdist=()
  if [ "$jobs" != 0 ] && "$py" -c "import xdist" 2>/dev/null; then xdist=(-n "$jobs"); else xdist=(-p no:xdist); fi
  # Where the harness is installed its plugin comes through the pytest11 entry point; elsewhere by -p.
  plugin=()
  "$py" -c "import importlib.metadata as m, sys; sys.exit(not any(e.value == 'harness.pytest_plugin' for e in m.entry_points(group='pytest11')))" 2>/dev/null \
    || plugin=(-p harness.pytest_plugin)
  export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
  (cd "$root" && "$py" -m pytest -q "${xdist[@]}" "${plugin[@]}" -m "not slow" --repro-dir none \
      suites/graphs suites/cuda_device suites/streams --junitxml="$out/$tag.suites.xml") \
      > "$out/$tag.suites.log" 2>&1
  (cd "$root/examples/cuda_runtime" && "$py" -m pytest -q -p no:xdist "${plugin[@]}" --repro-dir none \
      --emulate-cuda --junitxml="$out/$tag.example.xml") > "$out/$tag.example.log" 2>&1
  read -r p1 f1 s1 e1 < <(counts "$out/$tag.suites.xml")
  read -r p2 f2 s2 e2 < <(counts "$out/$tag.example.xml")
  passed=$((p1 + p2)); failed=$((f1 + f2)); skipped=$((s1 + s2)); errors=$((e1 + e2))
  [ $((failed + errors)) -eq 0 ] && [ "$passed" -gt 0 ] || status=1
  summary+=("$label at $build: $passed passed, $failed failed, $errors errors, $skipped skipped (logs: $out/$tag.*.log)")
done
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
exit $status
