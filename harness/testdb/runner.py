"""`harness run`: turn a rendered list into pytest processes, run them, and summarise per suite.

Lines that share their -k/-m filters run in one pytest process (pytest's filters are global to a
process); each line with a TIMEOUT runs in a process of its own, killed when its time is up.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from harness.testdb.junit import SuiteResult, format_table, merge, results_by_suite, suite_of
from harness.testdb.matching import Machine, select
from harness.testdb.render import nothing_selected
from harness.testdb.schema import TestDbError, TestLine, TestList

# Below this many tests, starting xdist workers (each imports torch) costs more than it saves.
HANDFUL = 8
PYTEST_EXIT = {2: "interrupted or collection errors", 3: "internal error", 4: "usage error",
               5: "no tests collected"}
_TEST_DEF = re.compile(r"^\s*(?:async\s+)?def test", re.MULTILINE)
_INHERITED_PYTEST_VARS = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID",
                          "PYTEST_CURRENT_TEST")


@dataclass(frozen=True)
class Invocation:
    """One pytest process: its test ids, the filters they share, and its time limit."""

    lines: tuple[TestLine, ...]
    keyword: str | None = None
    marker: str | None = None
    timeout: float | None = None


@dataclass(frozen=True)
class Outcome:
    invocation: Invocation
    returncode: int | None  # None when killed for its timeout
    junit: Path

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def plan(lines: list[TestLine]) -> list[Invocation]:
    groups: dict[tuple[str | None, str | None], list[TestLine]] = {}
    timed = []
    for line in lines:
        if line.timeout is not None:
            timed.append(Invocation((line,), line.keyword, line.marker, line.timeout))
        else:
            groups.setdefault((line.keyword, line.marker), []).append(line)
    return [Invocation(tuple(g), keyword, marker) for (keyword, marker), g in groups.items()] + timed


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
    cmd = [sys.executable, "-m", "pytest", *(line.test for line in invocation.lines),
           f"--graph-backend={backend}", f"--junitxml={junit}"]
    if invocation.keyword is not None:
        cmd += ["-k", invocation.keyword]
    if invocation.marker is not None:
        cmd += ["-m", invocation.marker]
    if workers:
        cmd += ["-n", str(workers)]
    return cmd + list(extra_args)


def execute(cmd: list[str], *, cwd: Path, timeout: float | None) -> int | None:
    """Run `cmd` with inherited stdout; its exit code, or None if it ran past `timeout` seconds."""
    env = {k: v for k, v in os.environ.items() if k not in _INHERITED_PYTEST_VARS}
    # Its own session, so a timeout kills xdist workers too and not just the controller.
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, start_new_session=timeout is not None)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def run_list(test_list: TestList, machine: Machine, *, root: Path, results_dir: Path,
             extra_args: tuple[str, ...] = (), log: Callable[[str], None] | None = None) -> int:
    """Run the lines of `test_list` that apply to `machine`; 0 when everything passed, 1 otherwise."""
    # Flushed, so that our lines land in order among the output of the pytest processes.
    log = log or functools.partial(print, flush=True)
    lines = select(test_list, machine)
    if not lines:
        raise TestDbError(nothing_selected(test_list, machine))
    invocations = plan(lines)
    parts_dir = results_dir / test_list.name
    shutil.rmtree(parts_dir, ignore_errors=True)
    parts_dir.mkdir(parents=True)
    log(f"[harness] {test_list.name} ({test_list.source}) on {machine}: "
        f"{len(lines)} lines in {len(invocations)} pytest run(s)")

    started = time.monotonic()
    outcomes = []
    for i, invocation in enumerate(invocations, start=1):
        workers = worker_count(estimate_test_count(invocation.lines, root), available_cpus())
        cmd = pytest_command(invocation, backend=machine.backend, junit=parts_dir / f"{i}.xml",
                             workers=workers, extra_args=extra_args)
        log(f"[harness] run {i}/{len(invocations)}: {shlex.join(['python', *cmd[1:]])}")
        outcomes.append(Outcome(invocation, execute(cmd, cwd=root, timeout=invocation.timeout), parts_dir / f"{i}.xml"))
    return _report(outcomes, results_dir / f"{test_list.name}.xml", time.monotonic() - started, log)


def _report(outcomes: list[Outcome], merged: Path, wall: float, log: Callable[[str], None]) -> int:
    junit_files = [o.junit for o in outcomes if o.junit.is_file()]
    results = results_by_suite(junit_files)
    problems = []
    for outcome in outcomes:
        lines = ", ".join(str(line) for line in outcome.invocation.lines)
        if outcome.timed_out:
            line = outcome.invocation.lines[0]
            problems.append(f"TIMEOUT after {line.timeout} s: {line}")
            suite = suite_of(line.path)
            results[suite] = results.get(suite, SuiteResult(suite)) + SuiteResult(suite, failed=1)
        elif outcome.returncode not in (0, 1):
            meaning = PYTEST_EXIT.get(outcome.returncode, "unexpected exit code")
            problems.append(f"pytest exited {outcome.returncode} ({meaning}) for: {lines}")
    merge(junit_files, merged)

    log("")
    log(format_table(results))
    for problem in problems:
        log(f"[harness] FAILED {problem}")
    # A timeout (returncode None) and every abnormal exit are also non-zero.
    failed = any(o.returncode != 0 for o in outcomes) or any(r.failed for r in results.values())
    log(f"[harness] JUnit XML: {merged}")
    log(f"[harness] {'FAILED' if failed else 'passed'} in {wall:.1f} s wall")
    return 1 if failed else 0
