"""The command line the sweep probes share (scripts/third_sweep_probe.py to eighth_sweep_probe.py):
each case a function returning one line of text, run in a process of its own by default (a refused
capture can leave CUDA's context unusable), or the named cases in this process; `--emulate` runs
them inside `harness.emulate_cuda(device="cpu")`. Plain torch otherwise. Also the runtime's warmed
capture, its verdict, and the helpers that cases share."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Callable

import torch


def registry() -> tuple[dict[str, Callable[[], str]], Callable]:
    """A probe's cases by name, and the decorator that adds a function to them."""
    cases: dict[str, Callable[[], str]] = {}

    def case(fn):
        cases[fn.__name__] = fn
        return fn

    return cases, case


def outcome(call: Callable[[], object]) -> str:
    """`ok <value>`, or the exception's type and first line: what CUDA answered, as text."""
    try:
        value = call()
        return f"ok {value!r}"[:240]
    except Exception as error:  # noqa: BLE001 (a probe reports whatever CUDA raised)
        return f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"


def warmed_capture(step: Callable[[], object], *, stream=None, pool=None):
    """A runtime's capture: three warmups on a side stream, then `torch.cuda.graph`; the graph
    and what the captured call returned."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream, pool=pool):
        out = step()
    return graph, out


def capture_verdict(step: Callable[[], object]) -> str:
    """`captured` (a replay ran), or the op's error inside the capture and the capture's end."""
    errors = []

    def guarded():
        try:
            return step()
        except RuntimeError as error:
            errors.append(f"{type(error).__name__}: {str(error).splitlines()[0][:110]}")

    try:
        graph, _ = warmed_capture(guarded)
    except RuntimeError as error:
        return f"op: {errors}; end: {type(error).__name__}: {str(error).splitlines()[0][:90]}"
    if errors:
        return f"op: {errors}; end: ok"
    graph.replay()
    torch.cuda.synchronize()
    return "captured"


def whole_answer(run: Callable[[], str]) -> str:
    """The case's line whole (`outcome` cuts at 240 characters), or what it raised."""
    try:
        return run()
    except Exception as error:  # noqa: BLE001 (a probe reports whatever CUDA raised)
        return f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"


def flags_a_sync(call: Callable[[], object]) -> bool:
    """Whether CUDA's sync debug mode ("error") refuses the call as a synchronizing one."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call()
        return False
    except RuntimeError as error:
        if "synchronizing" not in str(error):
            raise
        return True
    finally:
        torch.cuda.set_sync_debug_mode(0)


def seeded(*shape, seed=0, **kwargs) -> torch.Tensor:
    """A seeded normal tensor made on the host and moved to the device."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), **kwargs).to("cuda")


def run(cases: dict[str, Callable[[], str]], script: str, argv: list[str],
        answer: Callable[[Callable[[], str]], str] = lambda case: case()) -> None:
    """Print the build, then `case: answer` for each case of `argv` (every case without names);
    `script` is the probe's file, run again per case."""
    print(f"torch {torch.__version__}, "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}", flush=True)
    emulate = "--emulate" in argv
    names = [a for a in argv if not a.startswith("--")]
    if not names:
        for name in cases:
            command = [sys.executable, script, name] + (["--emulate"] if emulate else [])
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
            lines = [line for line in done.stdout.strip().splitlines()
                     if line.startswith(f"{name}: ")]
            print(lines[-1] if lines else f"{name}: exited {done.returncode}: "
                  f"{done.stderr.strip().splitlines()[-1:]}")
        return
    context = contextlib.nullcontext()
    if emulate:
        import harness

        context = harness.emulate_cuda(device="cpu")
    with context:
        for name in names:
            print(f"{name}: {answer(cases[name])}", flush=True)
