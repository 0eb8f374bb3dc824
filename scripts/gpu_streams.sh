#!/usr/bin/env bash
# The H200 runs for stream tracking (the races shown natively with torch.cuda._sleep), from the
# repository root with its venv; each part runs in under 5 minutes on one H200:
#   bash scripts/gpu_streams.sh races     # the race contract cases natively: the racy value every time
#   bash scripts/gpu_streams.sh faults    # the asynchronous fault family on cuda, JSON for `harness faults merge`
#   bash scripts/gpu_streams.sh multirank # captured collectives over nccl (needs 2 GPUs)
set -euo pipefail
PY=${PY:-.venv/bin/python}
export NCCL_NVLS_ENABLE=0
case "${1:-}" in
  races)
    # [cuda-*] ids: the racy version gives the racy value and the synchronized one the right value;
    # suites/streams runs each async_io piece natively (stalled with _sleep): all pass on correct code.
    "$PY" -m pytest -q -n 0 -p no:cacheprovider --graph-backend cuda --junitxml=streams-h200.xml \
      suites/graphs/test_stream_races.py suites/streams
    ;;
  faults)
    "$PY" -m harness.cli faults --graph-backend cuda --only pinned-staging-reused-before-copy \
      --only inputs-written-during-replay --only output-read-before-copy \
      --only side-stream-without-wait-stream --only freed-without-record-stream \
      --only captured-collective-not-waited --markdown --json h200-async-faults.json
    ;;
  multirank)
    "$PY" -m pytest -q -n 0 -p no:cacheprovider suites/distributed/test_captured_collectives.py -m "multirank and gpu"
    ;;
  *)
    echo "usage: bash scripts/gpu_streams.sh races|faults|multirank" >&2
    exit 2
    ;;
esac
