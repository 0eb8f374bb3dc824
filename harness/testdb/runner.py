"""`harness run`: turn a rendered list into pytest processes, run them, and summarise per suite.

Lines that share their -k/-m filters run in one pytest process (pytest's filters are global to a
process); each line with a TIMEOUT runs in a process of its own, killed when its time is up.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import re
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from harness.device_options import DeviceOverride, EmulatedDevice
from harness.testdb.child_pytest import plugin_arguments
from harness.testdb.matching import Machine, select
from harness.testdb.processes import StopRequest, execute, stopping_on_signals
from harness.testdb.render import nothing_selected
from harness.testdb.schema import TestDbError, TestLine, TestList
from harness.testdb.summary import Outcome, report

# Below this many tests, starting xdist workers (each imports torch) costs more than it saves.
HANDFUL = 8
_TEST_DEF = re.compile(r"^\s*(?:async\s+)?def test", re.MULTILINE)


@dataclass(frozen=True)
class Invocation:
    """One pytest process: its test ids, the filters they share, and its time limit."""

    lines: tuple[TestLine, ...]
    keyword: str | None = None
    marker: str | None = None
    timeout: float | None = None
    emulation: EmulatedDevice | None = None  # run under --emulate-cuda with this device
    engine_compile: str | None = None  # pytest --engine-compile


def plan(lines: list[TestLine]) -> list[Invocation]:
    """Lines sharing their filters, emulated device and engine compile mode share a process (each
    of those is global to a pytest session); a line with a TIMEOUT has one of its own."""
    groups: dict[tuple, list[TestLine]] = {}
    timed = []
    for line in lines:
        if line.timeout is not None:
            timed.append(Invocation((line,), line.keyword, line.marker, line.timeout, line.emulation,
                                    line.engine_compile))
        else:
            groups.setdefault((line.keyword, line.marker, line.emulation, line.engine_compile),
                              []).append(line)
    return [Invocation(tuple(g), keyword, marker, None, emulation, engine_compile)
            for (keyword, marker, emulation, engine_compile), g in groups.items()] + timed


def missing_paths(lines: list[TestLine], root: Path) -> list[TestLine]:
    """The lines whose file or folder is not under `root`: pytest would stop their whole process
    with a usage error, so they are reported and left out instead."""
    return [line for line in lines if not (root / line.path).exists()]


def estimate_test_count(lines: tuple[TestLine, ...], root: Path) -> int:
    """A lower bound without collecting: node ids count one, files and folders their `def test`s."""
    count = 0
    for line in lines:
        if "::" in line.test:
            count += 1
            continue
        path = root / line.path
        files = [path] if path.is_file() else [*path.rglob("test_*.py"), *path.rglob("*_test.py")]
        count += sum(len(_TEST_DEF.findall(f.read_text(errors="replace"))) for f in files)
    return count


def worker_count(num_tests: int, cpus: int) -> int:
    """xdist workers for a run, 0 for none: only with several CPUs and more than a handful of tests."""
    if cpus < 2 or num_tests <= HANDFUL or importlib.util.find_spec("xdist") is None:
        return 0
    return min(cpus, num_tests)


def available_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def pytest_command(invocation: Invocation, *, backend: str, junit: Path, workers: int,
                   extra_args: tuple[str, ...] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", *plugin_arguments(),
           *(line.test for line in invocation.lines), f"--graph-backend={backend}", f"--junitxml={junit}", "--junit-part-of-run"]
    if invocation.keyword is not None:
        cmd += ["-k", invocation.keyword]
    if invocation.marker is not None:
        cmd += ["-m", invocation.marker]
    if invocation.emulation is not None:
        cmd += invocation.emulation.pytest_args()
    if invocation.engine_compile is not None:
        cmd += ["--engine-compile", invocation.engine_compile]
    if workers and not decides_xdist(extra_args):
        cmd += ["-n", str(workers)]
    return cmd + list(extra_args)


def decides_xdist(extra_args: tuple[str, ...]) -> bool:
    """The user's pytest arguments choose the workers themselves, or turn xdist off."""
    words = list(extra_args)
    for word, following in zip(words, [*words[1:], ""]):
        if word in ("-n", "--numprocesses", "--dist", "-pno:xdist") or word.startswith(("--numprocesses=", "--dist=")):
            return True
        if word.startswith("-n") and (word[2:].isdigit() or word[2:] in ("auto", "logical")):
            return True
        if word == "-p" and following == "no:xdist":
            return True
    return False


def run_list(test_list: TestList, machine: Machine, *, root: Path, results_dir: Path,
             extra_args: tuple[str, ...] = (), log: Callable[[str], None] | None = None,
             json_path: Path | None = None, device: DeviceOverride = DeviceOverride()) -> int:
    """Run the lines of `test_list` that apply to `machine`, with pytest rooted at `root`; 0 when
    everything passed, 1 otherwise, 128 + the signal's number when SIGINT or SIGTERM cut it.
    `device` puts lines under the emulated device, or changes the device a list gave them."""
    # Flushed, so that our lines land in order among the output of the pytest processes.
    log = log or functools.partial(print, flush=True)
    lines = select(test_list, machine)
    if not lines:
        raise TestDbError(nothing_selected(test_list, machine))
    lines = [dataclasses.replace(line, emulation=device.apply(line.emulation)) for line in lines]
    if device.given and not any(line.emulation for line in lines):
        raise TestDbError(f"--{device.given[0].replace('_', '-')}: no line of list {test_list.name!r} "
                          f"runs under the emulated device; add --emulate-cuda, or an emulate_cuda "
                          f"field to the list's block")
    missing = missing_paths(lines, root)
    for line in missing:
        log(f"[harness] MISSING {line.path}: no such file or folder under {root}; "
            f"skipping the line {line}")
    invocations = plan([line for line in lines if line not in missing])
    parts_dir = results_dir / test_list.name
    shutil.rmtree(parts_dir, ignore_errors=True)
    parts_dir.mkdir(parents=True)
    log(f"[harness] {test_list.name} ({test_list.source}) on {machine}: "
        f"{len(lines)} lines in {len(invocations)} pytest run(s), rooted at {root}")

    started = time.monotonic()
    outcomes: list[Outcome] = []
    with stopping_on_signals() as stop:
        for i, invocation in enumerate(invocations, start=1):
            junit = parts_dir / f"{i}.xml"
            if stop.signum is not None:
                outcomes.append(Outcome(invocation, None, junit, cut="not started"))
                continue
            outcomes.append(_run_one(i, len(invocations), invocation, machine, root, junit, extra_args, stop, log))
        return report(outcomes, test_list=test_list, machine=machine, root=root,
                      merged=results_dir / f"{test_list.name}.xml", wall=time.monotonic() - started,
                      stopped_by=stop.signum, json_path=json_path, log=log, missing=tuple(missing))


def _run_one(i: int, total: int, invocation: Invocation, machine: Machine, root: Path, junit: Path,
             extra_args: tuple[str, ...], stop: StopRequest, log: Callable[[str], None]) -> Outcome:
    workers = worker_count(estimate_test_count(invocation.lines, root), available_cpus())
    cmd = pytest_command(invocation, backend=machine.backend, junit=junit, workers=workers,
                         extra_args=extra_args)
    log(f"[harness] run {i}/{total}: {shlex.join(['python', *cmd[1:]])}")
    code = execute(cmd, cwd=root, timeout=invocation.timeout, stop=stop)
    # A process that ended with its tests done (passed, failed, none collected) was not cut, even
    # if the signal came while it was finishing; pytest stopped by SIGINT exits 2.
    finished = code in (0, 1, 5)
    return Outcome(invocation, code, junit, cut="interrupted" if stop.signum is not None and not finished else None)
