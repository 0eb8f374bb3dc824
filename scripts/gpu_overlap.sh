#!/usr/bin/env bash
# The H200 runs for the overlap loop and the decode step near the hardware. Each part is one command
# and runs in under 5 minutes on one H200; run from the repository root with its venv:
#   bash scripts/gpu_overlap.sh bench      # harness bench capture + piecewise (tiny and 1b)
#   bash scripts/gpu_overlap.sh tests      # the overlap, model and attention suites on cuda
#   bash scripts/gpu_overlap.sh faults     # the three overlap faults, as JSON for `harness faults merge`
#   bash scripts/gpu_overlap.sh overlap    # overlap off and on in the engine suites on cuda, and the
#                                           # side-stream write under a queued read natively
set -euo pipefail
PY=${PY:-.venv/bin/python}
case "${1:-}" in
  bench)
    "$PY" -m harness.cli bench capture --backend cuda --iters 50 --warmup 10 --step-repeats 5 --output docs/benchmarks.md
    "$PY" -m harness.cli bench piecewise --shape tiny --prompt 16 --prompt 64 --prompt 256 --iters 50 --output docs/benchmarks.md
    "$PY" -m harness.cli bench piecewise --shape 1b --prompt 16 --prompt 64 --prompt 256 --iters 20 --output docs/benchmarks.md
    ;;
  tests)
    "$PY" -m pytest -q -n 0 --graph-backend cuda -p no:cacheprovider \
      suites/decoder/test_overlap.py suites/e2e/test_overlap.py suites/decoder/test_single_pass.py \
      suites/decoder/test_bench_capture.py suites/model suites/ops/test_attention.py \
      suites/ops/test_capture.py suites/piecewise/test_prefill.py suites/e2e/test_grounding.py
    ;;
  faults)
    "$PY" -m harness.cli faults --graph-backend cuda --only one-staging-buffer-for-two-steps \
      --only tokens-read-before-their-event --only inputs-written-while-a-replay-is-in-flight \
      --only pad-nan-leaks-into-real-rows --only max-seq-len-baked --markdown --json h200-overlap-faults.json
    ;;
  overlap)
    "$PY" -m pytest -q -n 0 --graph-backend cuda -p no:cacheprovider -m "not slow" -k overlap \
      suites/decoder suites/e2e suites/piecewise suites/faults/test_overlap_loop.py
    "$PY" -m pytest -q -n 0 -p no:cacheprovider -m gpu suites/graphs/test_stream_races.py \
      -k side_stream_writes_under_a_queued_read
    ;;
  *)
    echo "usage: bash scripts/gpu_overlap.sh bench|tests|faults|overlap" >&2
    exit 2
    ;;
esac
