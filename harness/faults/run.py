"""Measured detection: run each fault's detector in a pytest process of its own with the fault
planted, and without it, and judge the pair.

A planted run needs a session of its own: the fault is planted for the whole session, before the
test modules bind the planted functions. The clean runs need not: `run_zoo` runs the detectors
without a fault in `jobs` sessions of several detectors each, and only a detector that fails there
is run again alone (a test that fails only beside others is not the fault's false positive).
Sessions go `jobs` at a time, by default one per CPU core this process may use, each a process
forked from a server that imported torch once (sessions.py).

A fault is `detected` when the planted run fails with output matching the entry's `expected`
diagnosis, the fault fired, and the clean run passes. Anything else is a finding: `missed` (the
planted run passed), `not fired`, `wrong diagnosis` (it failed, but not for the expected reason),
`false positive` (the clean run fails too), `error` (pytest could not run it), `not plantable`
(this build or backend cannot plant it; the reason is given), or `not applicable` (the engines run
on the compiled path, `engine_compile="inductor"`, and the fault is planted into code that path
never runs; the reason is given, and nothing is run for it).

`engine_compile` is pytest's `--engine-compile` for every session: the detectors' engines whose
config leaves `EngineConfig.compile` unset run on that path (fixtures/models.py), so the same zoo
is judged on the eager ops and on the compiled path.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from harness.faults.registry import Fault
from harness.faults.sessions import run_session
from harness.provenance import checkout_root

VERDICTS = ("detected", "missed", "not fired", "wrong diagnosis", "false positive", "error",
            "not plantable", "not applicable")
ENGINE_COMPILE_VALUES = (None, "none", "inductor")  # None: the option not given (the eager ops)


@dataclass(frozen=True)
class PytestRun:
    returncode: int
    output: str
    fired: int | None
    seconds: float
    cpu_seconds: float | None = None  # sessions.py's


@dataclass(frozen=True)
class FaultRun:
    name: str
    verdict: str
    detector: str
    seconds: float  # the planted run's wall time
    fired: int | None = None
    detail: str = ""

    @property
    def detected(self) -> bool:
        return self.verdict == "detected"

    def to_dict(self) -> dict:
        return asdict(self)


def default_jobs() -> int:
    """Planted runs at a time when not told: the CPU cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS): every core
        return max(1, os.cpu_count() or 1)


def check_engine_compile(engine_compile: str | None) -> None:
    if engine_compile not in ENGINE_COMPILE_VALUES:
        raise ValueError(f"engine_compile must be one of {list(ENGINE_COMPILE_VALUES)}, got "
                         f"{engine_compile!r}")


def run_detector(node_id: str | Sequence[str], *, backend: str, fault: str | None, root: Path,
                 workdir: Path, engine_compile: str | None = None) -> PytestRun:
    """One pytest session of its own (sessions.py) running `node_id` (or several node ids together;
    no xdist), with `fault` planted if given and the engines compiled as `engine_compile` says
    (pytest's --engine-compile; None: not given). `-rA` lists each test's outcome by node id
    (`outcomes`)."""
    check_engine_compile(engine_compile)
    report = workdir / "fault-report.json"
    node_ids = [node_id] if isinstance(node_id, str) else list(node_id)
    args = [*node_ids, "-p", "no:xdist", "-q", "-rA", f"--graph-backend={backend}",
            f"--repro-dir={workdir / 'repro'}"]
    if engine_compile is not None:
        args += ["--engine-compile", engine_compile]
    if fault is not None:
        args += ["--plant-fault", fault, "--fault-report", str(report)]
    session = run_session(args, root=root)
    fired = json.loads(report.read_text())["fired"] if report.is_file() else None
    return PytestRun(session.returncode, session.output, fired, session.seconds, session.cpu_seconds)


def judge(fault: Fault, planted: PytestRun, clean: PytestRun | None) -> tuple[str, str]:
    """(verdict, detail) for a planted run and the clean run that follows it."""
    if planted.returncode == 0:
        skipped = _SKIPPED.findall(planted.output)
        why = f" (skipped: {skipped[0]})" if skipped and not outcomes(planted.output) else ""
        return "missed", f"{fault.detector} passed with the fault planted{why}"
    if planted.returncode != 1:
        return "error", f"pytest exited {planted.returncode}:\n{_tail(planted.output)}"
    if not planted.fired:
        # The session failed before reaching the planted code: its output says why.
        return "not fired", (f"the planted code never ran ({planted.fired} firings); the planted "
                             f"run failed:\n{_tail(planted.output)}")
    if not re.search(fault.expected, planted.output):
        return "wrong diagnosis", (f"failed without the expected diagnosis /{fault.expected}/:\n"
                                   f"{_tail(planted.output)}")
    if clean is not None and clean.returncode != 0:
        return "false positive", f"fails without the fault too:\n{_tail(clean.output)}"
    return "detected", ""


def _planted(fault: Fault, *, backend: str, root: Path, engine_compile: str | None) -> PytestRun:
    with tempfile.TemporaryDirectory(prefix=f"fault-{fault.name}-") as tmp:
        return run_detector(fault.detector, backend=backend, fault=fault.name, root=root,
                            workdir=Path(tmp, "planted"), engine_compile=engine_compile)


def _clean(detector: str | Sequence[str], *, backend: str, root: Path,
           engine_compile: str | None) -> PytestRun:
    with tempfile.TemporaryDirectory(prefix="fault-clean-") as tmp:
        return run_detector(detector, backend=backend, fault=None, root=root, workdir=Path(tmp, "clean"),
                            engine_compile=engine_compile)


def _result(fault: Fault, planted: PytestRun, clean: PytestRun | None) -> FaultRun:
    verdict, detail = judge(fault, planted, clean)
    return FaultRun(fault.name, verdict, fault.detector, round(planted.seconds, 1), planted.fired,
                    detail)


def not_run(fault: Fault, *, backend: str, engine_compile: str | None = None) -> FaultRun | None:
    """The FaultRun of a fault that is not run here, saying why (not plantable on this build or
    backend, not applicable on this engine path), or None for a fault to run."""
    reason = fault.unplantable(backend)
    if reason:
        return FaultRun(fault.name, "not plantable", fault.detector, 0.0, detail=reason)
    reason = fault.inapplicable(engine_compile)
    if reason:
        return FaultRun(fault.name, "not applicable", fault.detector, 0.0,
                        detail=f"not applicable on the compiled path: {reason}")
    return None


def run_fault(fault: Fault, *, backend: str, root: Path | None = None,
              engine_compile: str | None = None) -> FaultRun:
    """One fault: its planted run, then (if that failed) its detector's clean run, with the
    engines compiled as `engine_compile` says (pytest's --engine-compile; None: not given)."""
    check_engine_compile(engine_compile)
    root = root or checkout_root()
    skipped = not_run(fault, backend=backend, engine_compile=engine_compile)
    if skipped is not None:
        return skipped
    planted = _planted(fault, backend=backend, root=root, engine_compile=engine_compile)
    clean = (_clean(fault.detector, backend=backend, root=root, engine_compile=engine_compile)
             if planted.returncode == 1 else None)
    return _result(fault, planted, clean)


_OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|XPASS|XFAIL) (\S+)", re.MULTILINE)
_SKIPPED = re.compile(r"^SKIPPED \[\d+\] \S+: (.*)$", re.MULTILINE)


def outcomes(output: str) -> dict[str, str]:
    """Node id -> outcome, from the `-rA` summary of a pytest run's output (skips are listed by
    file and reason, not node id, and are absent)."""
    found: dict[str, str] = {}
    for outcome, node_id in _OUTCOME.findall(output):
        if found.get(node_id) not in ("FAILED", "ERROR"):  # a test that failed and errored in teardown
            found[node_id] = outcome
    return found


def failed_detectors(detectors: Sequence[str], run: PytestRun) -> set[str]:
    """The detectors the joint clean `run` did not pass: a test of theirs failed or errored, or none
    of them ran at all while the run failed (collection errors, a crash)."""
    seen = outcomes(run.output)
    failed = set()
    for detector in detectors:
        # A detector without parameters runs every parametrization of its test.
        mine = [outcome for node_id, outcome in seen.items()
                if node_id == detector or node_id.startswith(detector + "[")]
        if any(outcome in ("FAILED", "ERROR") for outcome in mine) or (not mine and run.returncode != 0):
            failed.add(detector)
    return failed


def run_zoo(faults: Iterable[Fault], *, backend: str, jobs: int | None = None, root: Path | None = None,
            log: Callable[[str], None] = lambda line: None,
            engine_compile: str | None = None) -> list[FaultRun]:
    """Every fault's FaultRun, in the order given. `jobs` sessions at a time (by default
    `default_jobs()`): the clean runs of the detectors, split into `jobs` sessions of several
    detectors each, first (they are the longest), then each fault's planted run. A detector that
    fails in its joint clean run and whose planted run failed is run again alone, and only that run
    judges it. Every session runs with the engines compiled as `engine_compile` says (pytest's
    --engine-compile; None: not given); a fault not applicable on that path is not run."""
    check_engine_compile(engine_compile)
    faults = list(faults)
    root = root or checkout_root()
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"jobs must be 1 or more, got {jobs}")
    plantable = [f for f in faults if not_run(f, backend=backend, engine_compile=engine_compile) is None]
    detectors = list(dict.fromkeys(f.detector for f in plantable))
    chunks = [detectors[i::jobs] for i in range(min(jobs, len(detectors)))]
    cpu: list[float] = []

    def clean_chunk(chunk: list[str]) -> tuple[list[str], PytestRun]:
        run = _clean(chunk, backend=backend, root=root, engine_compile=engine_compile)
        cpu.append(run.cpu_seconds or 0.0)
        log(f"[faults] {len(chunk)} detector(s) without a fault, in one session: exited "
            f"{run.returncode} ({run.seconds:.1f} s)")
        return chunk, run

    def planted(fault: Fault) -> PytestRun:
        run = _planted(fault, backend=backend, root=root, engine_compile=engine_compile)
        cpu.append(run.cpu_seconds or 0.0)
        log(f"[faults] {fault.name}: planted run exited {run.returncode} ({run.seconds:.1f} s)")
        return run

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        joint = [pool.submit(clean_chunk, chunk) for chunk in chunks]
        planted_runs = dict(zip((f.name for f in plantable), pool.map(planted, plantable)))
        joint_runs = [future.result() for future in joint]
    clean: dict[str, PytestRun] = {}
    failed_beside: set[str] = set()
    for chunk, run in joint_runs:
        failed = failed_detectors(chunk, run)
        failed_beside |= failed
        passed = PytestRun(0, run.output, None, run.seconds)  # for the detectors it passed
        clean.update({detector: passed for detector in chunk if detector not in failed})
    alone = sorted(d for d in failed_beside
                   if any(f.detector == d and planted_runs[f.name].returncode == 1 for f in plantable))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        alone_runs = pool.map(lambda d: _clean(d, backend=backend, root=root,
                                               engine_compile=engine_compile), alone)
        for detector, run in zip(alone, alone_runs):
            log(f"[faults] {detector}: failed beside the others; alone it exited {run.returncode}")
            clean[detector] = run
    if any(cpu):
        log(f"[faults] {len(cpu)} planted and joint pytest sessions, {sum(cpu):.0f} s of CPU summed "
            f"(with the processes they started)")
    results = []
    for fault in faults:
        run = planted_runs.get(fault.name)
        if run is None:
            results.append(not_run(fault, backend=backend, engine_compile=engine_compile))
            continue
        result = _result(fault, run, clean.get(fault.detector))
        log(f"[faults] {fault.name}: {result.verdict} ({result.seconds:.1f} s)")
        results.append(result)
    return results


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])
