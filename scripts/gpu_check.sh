#!/usr/bin/env bash
# What the lead runs on a lent GPU machine (no package registry there): install the project without
# dependencies, then run the contract suite on both backends and the GPU-marked suites, leaving JUnit
# XML and logs in ${OUT:-results/gpu}.
set -uo pipefail
out="${OUT:-results/gpu}"
mkdir -p "$out"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
python3 - <<'PY' | tee "$out/machine.txt"
import platform, torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__, "python", platform.python_version())
print("gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
PY
status=0
run() { local name="$1"; shift; echo "== $name"; python3 -m pytest -q -p no:cacheprovider --junitxml="$out/$name.xml" "$@" > "$out/$name.log" 2>&1; local rc=$?; tail -n 3 "$out/$name.log"; [ $rc -eq 0 ] || status=1; }
for suite in "$@"; do
  case "$suite" in
    contract) run contract-cuda suites/graphs --graph-backend cuda; run contract-emulated suites/graphs --graph-backend emulated ;;
    gpu) run gpu-marked suites -m gpu --graph-backend cuda ;;
    *) run "$(echo "$suite" | tr '/' '-')" "$suite" --graph-backend cuda ;;
  esac
done
exit $status
