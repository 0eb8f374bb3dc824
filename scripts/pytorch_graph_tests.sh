#!/usr/bin/env bash
# PyTorch's own CUDA-graph tests, unmodified, on the emulated CUDA device, per torch build.
# Usage, from the repository root:
#
#   bash scripts/pytorch_graph_tests.sh PATH/TO/test_cuda.py OUT_DIR [PYTHON ...]
#   bash scripts/pytorch_graph_tests.sh PATH/TO/test_cudagraph_trees.py OUT_DIR [PYTHON ...]
#   bash scripts/pytorch_graph_tests.sh -k EXPRESSION PATH/TO/test_cuda.py OUT_DIR [PYTHON ...]
#
# -k EXPRESSION replaces the default selection with pytest's -k EXPRESSION (e.g. "TestMemPool" or
# "test_streams or test_events"); -k "" runs the whole file. -c DEVICES emulates that many devices
# (--emulate-cuda-count), e.g. -c 2 for test_cuda_multigpu.py's TEST_MULTIGPU cases; the native
# runs see the machine's own GPUs.
# Also run whole when given (2026-12-06): test/dynamo/test_cudagraphs.py (dynamo's
# backend="cudagraphs") and test/test_cuda_multigpu.py (device indices, device contexts, streams
# and events, torch.cuda.comm; a copy newer than the installed torch may need a conftest.py of
# placeholders beside it, see docs/fidelity.md) and test/test_cuda_sanitizer.py (CSAN).
# PATH/TO/test_cuda.py is PyTorch's test/test_cuda.py from a commit near each installed torch
# (not part of this repository); test_cudagraph_trees.py is its test/inductor/ file of inductor's
# cudagraph trees (torch.compile's CUDA graphs), run whole (a test_cuda.py runs the graph family
# below). The tree tests decide at import whether CUDA and Triton are there
# (inductor_utils.HAS_CUDA_AND_TRITON); the plugin enters the emulation before collection, so
# they run, and those that inspect the trees' own manager fail (docs/fidelity.md lists why). Each PYTHON (default: python) is one build's interpreter; its
# environment needs pytest, expecttest and psutil (torch.testing's helpers import them; a
# PYTHONPATH given to this script is kept, e.g. a `pip install --target DIR expecttest psutil`).
# The harness is put on its path from this checkout, and its pytest plugin loaded with `-p` where
# that interpreter has no entry point for it. The test file's own folder is pytest's rootdir, with
# an empty ini file and no conftest.py above it, so a copy inside this repository takes neither the
# repository's options nor its conftest
# (--strict-markers refuses PyTorch's `serial` mark). For each build the script runs the
# test_graph_* / test_cuda_graph_* family:
#   emulated: --emulate-cuda with the GPU hidden (CUDA_VISIBLE_DEVICES=): the CPU wheel (with
#             --emulate-cuda-version 12.8, since the file gates its graph tests on torch.version.cuda), or the
#             CUDA wheel on a machine without a GPU (what CI runners have); with
#             --cuda-races report, since test_graph_concurrent_replay races two replays on purpose
#             and asserts the corruption CUDA gives (strict tracking would raise RaceError; the
#             race is still reported, as a RaceWarning);
#   and, where that interpreter's torch sees a GPU,
#   native:    real CUDA graphs, the verdicts to match;
#   sanitizer: --emulate-cuda on the GPU (real tensors and streams, emulated graphs), with
#              --cuda-races report: test_graph_three_successive replays a graph that reads pool
#              memory another graph overwrote and asserts the values CUDA reads there (the
#              sanitizer tracks no stream races; that replay is all the setting decides there).
# Each run leaves OUT_DIR/<build>-<run>.txt and .xml and prints its last line; docs/fidelity.md
# lists the verdicts and every case that differs, with its reason.
set -u
CHOSEN=
COUNT=()
USAGE="usage: $0 [-k EXPRESSION] [-c DEVICES] PATH/TO/test_cuda.py OUT_DIR [PYTHON ...]"
while [ "${1:-}" = "-k" ] || [ "${1:-}" = "-c" ]; do
    if [ $# -lt 2 ]; then
        echo "$USAGE" >&2
        exit 2
    fi
    case $1 in
        -k) CHOSEN=set SELECTION=$2 ;;
        -c) COUNT=(--emulate-cuda-count "$2") ;;
    esac
    shift 2
done
if [ $# -lt 2 ]; then
    echo "$USAGE" >&2
    exit 2
fi
TEST_FILE=$(realpath "$1")
OUT=$(realpath -m "$2")
shift 2
PYTHONS=("$@")
[ ${#PYTHONS[@]} -eq 0 ] && PYTHONS=(python)
ROOT=$(pwd)
SELECT="test_graph_ or test_cuda_graph_"
LIMIT=1200
case $(basename "$TEST_FILE") in
    test_cudagraph_trees.py) SELECT=""; LIMIT=3600 ;;  # the whole file: 191 cases, ~15 min on 2 cores
    # run whole: dynamo's backend="cudagraphs" (test/dynamo/), and the device, stream and event
    # cases of the multi-GPU file (those that need a second device skip themselves)
    test_cudagraphs.py|test_cuda_multigpu.py|test_cuda_sanitizer.py) SELECT="" ;;
esac
[ -n "$CHOSEN" ] && { SELECT=$SELECTION; LIMIT=3600; }
mkdir -p "$OUT"
printf '[pytest]\n' > "$OUT/pytest.ini"
status=0
run() {  # build name, run name, python, extra environment, pytest arguments...
    local build=$1 name=$2 python=$3 env=$4
    shift 4
    (cd "$(dirname "$TEST_FILE")" && env $env PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
        timeout $LIMIT "$python" -m pytest -c "$OUT/pytest.ini" --rootdir "$(dirname "$TEST_FILE")" \
        --confcutdir "$(dirname "$TEST_FILE")" \
        "${PLUGIN[@]}" -p no:cacheprovider -p no:xdist -q -rA \
        --junitxml="$OUT/$build-$name.xml" "$(basename "$TEST_FILE")" ${SELECT:+-k "$SELECT"} "$@") \
        > "$OUT/$build-$name.txt" 2>&1
    local rc=$?
    [ $rc -gt 1 ] && status=1
    echo "$build $name: exit $rc ($(tail -n 1 "$OUT/$build-$name.txt"))"
}
for python in "${PYTHONS[@]}"; do
    # each run starts in the test file's folder, so a relative interpreter path is resolved here
    case $python in */*) python=$(realpath -s "$python") ;; esac
    build=$("$python" -c "import torch; print(torch.__version__)" 2>/dev/null) || {
        echo "$python: no torch" >&2; status=1; continue; }
    PLUGIN=()
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$python" -c "
import sys
from importlib.metadata import entry_points
sys.exit(0 if any(e.value == 'harness.pytest_plugin' for e in entry_points(group='pytest11')) else 1)
" || PLUGIN=(-p harness.pytest_plugin)
    # A CPU build's torch.version.cuda is None, and test_cuda.py gates the graph tests on it: the
    # emulation reports a CUDA version there only when asked by name.
    version=()
    "$python" -c "import sys, torch; sys.exit(torch.version.cuda is not None)" && version=(--emulate-cuda-version 12.8)
    run "$build" emulated "$python" "CUDA_VISIBLE_DEVICES=" --emulate-cuda --cuda-races report \
        "${version[@]}" "${COUNT[@]}"
    if "$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        run "$build" native "$python" ""
        run "$build" sanitizer "$python" "" --emulate-cuda --cuda-races report
    fi
done
exit $status
