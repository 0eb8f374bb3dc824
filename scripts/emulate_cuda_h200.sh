#!/usr/bin/env bash
# The emulated CUDA device's checks on a GPU machine (harness.emulate_cuda(): native runs, and the
# graph sanitizer with --emulate-cuda). Usage, from the repository root:
#
#   bash scripts/emulate_cuda_h200.sh PATH/TO/test_cuda.py OUT_DIR
#
# PATH/TO/test_cuda.py is PyTorch's own test/test_cuda.py, from the tag of the installed torch
# (its imports follow torch.testing's internals of that version); it is not part of this
# repository. torch.testing's helpers need `expecttest` and `psutil` installed.
# What it should show: PyTorch's test_graph_* family passes natively (PyTorch's expected
# failures xfail); under --emulate-cuda at most the four cases listed in docs/fidelity.md differ;
# examples/cuda_runtime passes natively and under --emulate-cuda, its planted bugs caught in both;
# suites/graphs and suites/cuda_device pass natively and under --emulate-cuda.
set -u
TEST_FILE=$(realpath "$1")
OUT=$(realpath -m "${2:-out}")
mkdir -p "$OUT"
ROOT=$(pwd)
run() {  # name, directory, pytest arguments...
    local name=$1 dir=$2
    shift 2
    (cd "$dir" && timeout 1200 python -m pytest -p no:cacheprovider -p no:xdist -q -rA \
        --junitxml="$OUT/$name.xml" "$@") > "$OUT/$name.txt" 2>&1
    echo "$name: exit $? ($(tail -n 1 "$OUT/$name.txt"))"
}
run pytorch_graphs_native "$(dirname "$TEST_FILE")" "$(basename "$TEST_FILE")" -k test_graph_
run pytorch_graphs_sanitizer "$(dirname "$TEST_FILE")" "$(basename "$TEST_FILE")" -k test_graph_ --emulate-cuda
run example_native "$ROOT/examples/cuda_runtime" --repro-dir none
run example_sanitizer "$ROOT/examples/cuda_runtime" --repro-dir none --emulate-cuda
run contract_native "$ROOT" suites/graphs suites/cuda_device -m "not slow" --repro-dir none
run contract_sanitizer "$ROOT" suites/graphs suites/cuda_device -m "not slow" --repro-dir none --emulate-cuda
