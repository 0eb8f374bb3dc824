"""Where CUDA refuses a thread's first matmul inside a capture, case by case, in one fresh process.

PyTorch creates a thread's cuBLAS handle at its first BLAS call on a device (`cublasCreate`), and
takes a handle back from an ended thread instead when one is free (CublasHandlePool.cpp). The cases
run in an order where that pool is known: no thread has ended holding a handle until the last two.
Prints one JSON object, case -> "ok" or the first line of the error (and of capture_end's, when the
capture then failed). Natively on a GPU (`python scripts/cublas_handle_probe.py`) or on the emulated
device (`--emulate`); suites/cuda_device/test_cublas_handles.py compares both to what it expects.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading

import torch


REFUSED = "CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`"
INVALIDATED = "operation failed due to a previous error during capture"
NOT_PERMITTED = "operation not permitted when stream is capturing"


def first_line(error: BaseException) -> str:
    """What CUDA says (the emulated device's detail, after it, is left out)."""
    text = str(error).splitlines()[0]
    for known in (INVALIDATED, REFUSED, NOT_PERMITTED):
        if known in text:
            return known
    return text


def capture(fn, mode: str) -> str:
    """Capture `fn` in `mode`; "ok" when it captured and replayed, else what failed."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    outcome = "ok"
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode=mode)
        try:
            fn()
        except RuntimeError as error:
            outcome = first_line(error)
        try:
            graph.capture_end()
        except RuntimeError as error:
            outcome += " / capture_end: " + first_line(error)
    torch.cuda.current_stream().wait_stream(stream)
    if outcome == "ok":
        graph.replay()
        torch.cuda.synchronize()
    return outcome


def in_thread(fn) -> tuple[threading.Thread, threading.Event, list]:
    """Run `fn` in a new thread that stays alive (holding its handle) until the event is set."""
    done, result = threading.Event(), []

    def run():
        result.append(fn())
        done.wait()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, done, result


def probe() -> dict[str, str]:
    a = torch.ones(16, 16, device="cuda")
    matmul = lambda: a @ a  # noqa: E731
    out: dict[str, str] = {}
    kept = []
    out["main thread, global"] = capture(matmul, "global")
    for mode in ("thread_local", "relaxed"):
        thread, done, result = in_thread(lambda mode=mode: capture(matmul, mode))
        while not result:
            thread.join(0.01)
        out[f"new thread, {mode}"] = result[0]
        kept.append((thread, done))  # the relaxed one holds a handle: it must not end yet

    def other_thread_during(mode: str) -> str:
        def body():
            side = torch.cuda.Stream()

            def other():
                with torch.cuda.stream(side):
                    try:
                        b = torch.ones(16, 16, device="cuda")
                        (b @ b).sum()
                        return "ok"
                    except RuntimeError as error:
                        return first_line(error)

            thread, done, result = in_thread(other)
            while not result:
                thread.join(0.01)
            kept.append((thread, done))
            body.other = result[0]
            a.add_(1)
        outcome = capture(body, mode)
        return f"other thread: {body.other}; capture: {outcome}"

    out["another thread while the main thread captures, global"] = other_thread_during("global")
    out["another thread while the main thread captures, thread_local"] = other_thread_during(
        "thread_local")
    # Every thread kept so far ends: those that made a handle give it back to the pool.
    for thread, done in kept:
        done.set()
        thread.join()
    thread, done, result = in_thread(lambda: capture(matmul, "global"))
    done.set()
    thread.join()
    out["new thread after threads with handles ended, global"] = result[0]
    out["main thread after its refusal, warmed up, global"] = (matmul(), capture(matmul, "global"))[1]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--emulate", action="store_true", help="on the emulated CUDA device")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.emulate:
            import harness

            stack.enter_context(harness.emulate_cuda())
        elif not torch.cuda.is_available():
            parser.error("no CUDA device: pass --emulate for the emulated one")
        print(json.dumps({"torch": torch.__version__, "emulated": args.emulate, **probe()},
                         indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
