"""A thread's first matmul inside a capture, refused where CUDA refuses it.

PyTorch creates a thread's cuBLAS handle at its first BLAS call on a device, unless an ended
thread gave one back (CublasHandlePool.cpp); `cublasCreate` during a capture is a potentially
unsafe call, so CUDA refuses it by cudaStreamCaptureMode (every thread in "global" mode, the
capturing thread in "thread_local", none in "relaxed") and the capture is invalidated. On the H200
(torch 2.11) an xdist worker whose first matmul was captured failed so.

Handles live as long as the process, so the cases need a process whose pool is known: the probe
(scripts/cublas_handle_probe.py) runs them in a fresh one, natively on a GPU and on the emulated
device on a CPU, and both must give EXPECTED. The in-process tests use a fresh emulated device."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import harness
from harness.emulation import emulation_active
from harness.graphs.base import CaptureError

PROBE = Path(__file__).resolve().parents[2] / "scripts" / "cublas_handle_probe.py"
REFUSED = "CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`"
INVALIDATED = "capture_end: operation failed due to a previous error during capture"
NOT_PERMITTED = "operation not permitted when stream is capturing"
EXPECTED = {
    "main thread, global": f"{REFUSED} / {INVALIDATED}",
    "new thread, thread_local": f"{REFUSED} / {INVALIDATED}",
    "new thread, relaxed": "ok",
    "another thread while the main thread captures, global":
        (f"other thread: {NOT_PERMITTED}; capture: operation failed due to a previous error during "
         f"capture / {INVALIDATED}"),
    "another thread while the main thread captures, thread_local": "other thread: ok; capture: ok",
    "new thread after threads with handles ended, global": "ok",
    "main thread after its refusal, warmed up, global": "ok",
}


def run_probe(*args: str) -> dict:
    # The probe imports the harness this test runs, not whichever one the interpreter installed.
    harness_root = str(Path(harness.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [harness_root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(PROBE), *args], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    return {case: found[case] for case in EXPECTED}


@pytest.mark.skipif(emulation_active() is not None or torch.cuda.is_available(),
                    reason="the probe enters its own emulation, the emulated device only on a CPU "
                           "(on a GPU it would be the graph sanitizer, over real cuBLAS)")
def test_the_emulated_device_refuses_a_first_matmul_in_a_capture_where_cuda_does():
    assert run_probe("--emulate") == EXPECTED


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_refuses_a_first_matmul_in_a_capture_where_the_probe_expects():
    assert run_probe() == EXPECTED


@pytest.fixture
def fresh_device():
    if emulation_active() is not None or torch.cuda.is_available():
        pytest.skip("handles live as long as the process: this needs an emulated device of its own")
    with harness.emulate_cuda():
        yield


def _capture(fn) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def test_the_refusal_begins_with_cudas_text_and_names_the_op_the_line_and_the_warmup(fresh_device):
    a = torch.ones(4, 4, device="cuda")
    graph = torch.cuda.CUDAGraph()
    caught = []
    with pytest.raises(RuntimeError, match="operation failed due to a previous error during capture"):
        with torch.cuda.graph(graph):
            try:
                torch.mm(a, a)
            except CaptureError as error:
                caught.append(str(error))  # caught: the capture is still invalidated
    cuda_line, detail = caught[0].split("\n", 1)
    assert cuda_line == f"CUDA error: {REFUSED}"
    assert detail.startswith("torch.mm is this thread's first BLAS call on the device")
    assert "test_cublas_handles.py" in detail and "torch.mm(a, a)" in detail
    assert "run one matmul in this thread before capture_begin()" in detail


def test_a_thread_warmed_up_before_capture_captures_its_matmul(fresh_device):
    a = torch.full((4, 4), 2.0, device="cuda")
    out = torch.empty(4, 4, device="cuda")
    step = lambda: torch.matmul(a, a, out=out)  # noqa: E731
    step()  # the warmup a runtime runs before it captures
    graph = _capture(step)
    a.fill_(3.0)
    graph.replay()
    assert out[0].tolist() == [36.0] * 4


def test_a_matmul_with_an_empty_operand_makes_no_handle(fresh_device):
    empty = torch.ones(0, 4, device="cuda")
    graph = _capture(lambda: empty @ torch.ones(4, 4, device="cuda"))  # CUDA's kernels return early
    graph.replay()
    with pytest.raises(RuntimeError, match="cublasCreate"):
        _capture(lambda: torch.ones(2, 4, device="cuda") @ torch.ones(4, 4, device="cuda"))


def test_a_compiled_warmup_creates_the_handle_as_inductors_cublas_call_does(fresh_device):
    fn = torch.compile(lambda x: x @ x)
    x = torch.ones(4, 4, device="cuda")
    fn(x)  # inductor's extern mm calls cuBLAS on CUDA
    with contextlib.suppress(Exception):
        torch._dynamo.reset()
    graph = _capture(lambda: x @ x)
    graph.replay()


@pytest.mark.parametrize("mode, refused", [("global", True), ("thread_local", False)])
def test_backwards_first_matmul_is_the_autograd_engine_threads(fresh_device, mode, refused):
    # The engine runs a device's backward in a thread of its own: its handle is made at its first
    # matmul, which a global capture refuses from any thread and a thread_local one allows.
    w = torch.ones(4, 4, device="cuda", requires_grad=True)
    x = torch.ones(4, 4, device="cuda")
    x @ x  # this thread's handle, before the capture
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        loss = (x @ w).sum()
        graph.capture_begin(capture_error_mode=mode)
        try:
            loss.backward()
        except CaptureError as error:
            assert refused and "the autograd engine's device thread's first BLAS call" in str(error)
        else:
            assert not refused
        finally:
            with contextlib.suppress(RuntimeError):
                graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
