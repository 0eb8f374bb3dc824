#!/usr/bin/env bash
# What the lead runs on a lent GPU machine (no package registry there): install the project without
# dependencies, then run the named steps, leaving JUnit XML, JSON and logs in ${OUT:-results/gpu}.
#
#   scripts/gpu_check.sh tests multirank faults     # then: audit bench
#
# Steps:
#   tests     the contract suite on every backend (GPU 0) and the runtime suites with --graph-backend
#             cuda (the last GPU), both at once: contract.xml, runtime.xml
#   multirank the multirank suites over nccl, one GPU per rank (needs 2 GPUs): multirank.xml
#   faults    the fault zoo on cuda: faults_cuda.json
#   audit     the transformers audit, cuda (bf16 on GPU 0, fp32 on the last GPU, at once), then the
#             emulator and the emulated device (--emulate-cuda) on this host's CPUs:
#             audit_{cuda,emulated,emulate_cuda}_{bfloat16,float32}.json
#   bench     harness bench capture (with a profile of the tiny step at batch 1) and piecewise
# What the results feed: scripts/fidelity_table.py (docs/fidelity.md), harness audit merge
# (docs/audit-transformers.md), harness faults merge (docs/faults.md), docs/benchmarks.md.
set -uo pipefail
out="${OUT:-results/gpu}"
mkdir -p "$out"
py=python3
# NO_INSTALL=1: already installed (several instances running side by side would race on the install)
if [ "${NO_INSTALL:-0}" != 1 ]; then
  $py -m pip install -q --no-deps --no-build-isolation -e . > "$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
fi
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
ngpu=$($py -c "import torch; print(torch.cuda.device_count())")
last=$(( ngpu > 0 ? ngpu - 1 : 0 ))
$py - <<'PY' | tee "$out/machine.txt"
import platform, subprocess, torch, transformers
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print("commit", commit or "unknown", "torch", torch.__version__, "transformers", transformers.__version__,
      "python", platform.python_version())
print("gpus", torch.cuda.device_count(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
PY
status=0
check() { local name="$1" rc="$2"; echo "== $name: exit $rc"; tail -n 3 "$out/$name.log"; [ "$rc" -eq 0 ] || status=1; }
runtime_suites="suites/decoder suites/piecewise suites/e2e suites/model suites/ops suites/check suites/adapters suites/examples suites/repro"
for step in "$@"; do
  case "$step" in
    tests)
      CUDA_VISIBLE_DEVICES=0 timeout 400 $py -m pytest -q -n 4 suites/graphs -m "not slow" \
        --junitxml="$out/contract.xml" > "$out/contract.log" 2>&1 & a=$!
      CUDA_VISIBLE_DEVICES=$last timeout 400 $py -m pytest -q -n 4 $runtime_suites -m "not slow" \
        --graph-backend cuda --junitxml="$out/runtime.xml" > "$out/runtime.log" 2>&1 & b=$!
      wait $a; check contract $?; wait $b; check runtime $? ;;
    multirank)
      if [ "$ngpu" -lt 2 ]; then echo "== multirank: skipped, $ngpu GPU(s)"; continue; fi
      timeout 200 $py -m pytest -q -p no:xdist -rA suites/distributed -m "multirank and gpu" \
        --junitxml="$out/multirank.xml" > "$out/multirank.log" 2>&1
      check multirank $? ;;
    faults)
      timeout 400 $py -m harness.cli faults --graph-backend cuda -j 4 --json "$out/faults_cuda.json" \
        > "$out/faults.log" 2>&1
      check faults $? ;;
    audit)
      # cuda first, both dtypes at once (8 processes each), then the emulator on this host's CPUs
      # (same torch and transformers as the cuda column); AUDIT_CUDA_S / AUDIT_EMU_S bound each,
      # AUDIT_BACKENDS picks (default "cuda emulated emulate_cuda": the last is the emulated
      # device, `--emulate-cuda`, with the GPUs hidden), AUDIT_JOBS sets the processes of each run.
      backends="${AUDIT_BACKENDS:-cuda emulated emulate_cuda}"
      pids=()
      for dtype in bfloat16 float32; do
        [[ " $backends " == *" cuda "* ]] || continue
        gpu=$([ "$dtype" = bfloat16 ] && echo 0 || echo "$last")
        CUDA_VISIBLE_DEVICES=$gpu timeout "${AUDIT_CUDA_S:-400}" $py -m harness.cli audit transformers \
          --graph-backend cuda --dtype $dtype -j "${AUDIT_JOBS:-8}" --json "$out/audit_cuda_$dtype.json" \
          > "$out/audit_cuda_$dtype.log" 2>&1 & pids+=($!)
      done
      for pid in "${pids[@]}"; do wait "$pid" || status=1; done
      pids=()
      for dtype in bfloat16 float32; do
        [[ " $backends " == *" emulated "* ]] || continue
        CUDA_VISIBLE_DEVICES= timeout "${AUDIT_EMU_S:-300}" $py -m harness.cli audit transformers \
          --graph-backend emulated --dtype $dtype -j "${AUDIT_JOBS:-8}" --json "$out/audit_emulated_$dtype.json" \
          > "$out/audit_emulated_$dtype.log" 2>&1 & pids+=($!)
      done
      for pid in "${pids[@]}"; do wait "$pid" || status=1; done
      pids=()
      for dtype in bfloat16 float32; do
        [[ " $backends " == *" emulate_cuda "* ]] || continue
        CUDA_VISIBLE_DEVICES= timeout "${AUDIT_EMU_S:-300}" $py -m harness.cli audit transformers \
          --emulate-cuda --dtype $dtype -j "${AUDIT_JOBS:-8}" --json "$out/audit_emulate_cuda_$dtype.json" \
          > "$out/audit_emulate_cuda_$dtype.log" 2>&1 & pids+=($!)
      done
      for pid in "${pids[@]}"; do wait "$pid" || status=1; done
      tail -n 2 "$out"/audit_*.log ;;
    bench)
      timeout 200 $py -m harness.cli bench capture --iters 50 --warmup 5 --output "$out/benchmarks.md" \
        > "$out/bench_capture.log" 2>&1; check bench_capture $?
      timeout 120 $py -m harness.cli bench capture --model tiny --profile \
        > "$out/bench_profile.log" 2>&1; check bench_profile $?
      timeout 120 $py -m harness.cli bench piecewise --iters 50 --warmup 5 --output "$out/benchmarks.md" \
        > "$out/bench_piecewise.log" 2>&1; check bench_piecewise $? ;;
    *) echo "unknown step $step (tests, multirank, faults, audit, bench)"; status=2 ;;
  esac
done
exit $status
