"""Measured detection: run each fault's detector in a pytest process of its own, once with the
fault planted and once without, and judge the pair.

A fault is `detected` when the planted run fails with output matching the entry's `expected`
diagnosis, the fault fired, and the clean run passes. Anything else is a finding: `missed` (the
planted run passed), `not fired`, `wrong diagnosis` (it failed, but not for the expected reason),
`false positive` (the clean run fails too), `error` (pytest could not run it), or `not plantable`
(this build or backend cannot plant it; the reason is given).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

from harness.faults.registry import Fault
from harness.provenance import checkout_root

VERDICTS = ("detected", "missed", "not fired", "wrong diagnosis", "false positive", "error",
            "not plantable")


@dataclass(frozen=True)
class PytestRun:
    returncode: int
    output: str
    fired: int | None
    seconds: float


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


def run_detector(node_id: str, *, backend: str, fault: str | None, root: Path,
                 workdir: Path) -> PytestRun:
    """One pytest process running `node_id` alone (no xdist), with `fault` planted if given."""
    report = workdir / "fault-report.json"
    cmd = [sys.executable, "-m", "pytest", node_id, "-p", "no:xdist", "-q",
           f"--graph-backend={backend}", f"--repro-dir={workdir / 'repro'}"]
    if fault is not None:
        cmd += ["--plant-fault", fault, "--fault-report", str(report)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    fired = json.loads(report.read_text())["fired"] if report.is_file() else None
    return PytestRun(proc.returncode, proc.stdout + proc.stderr, fired, seconds)


def judge(fault: Fault, planted: PytestRun, clean: PytestRun | None) -> tuple[str, str]:
    """(verdict, detail) for a planted run and the clean run that follows it."""
    if planted.returncode == 0:
        return "missed", f"{fault.detector} passed with the fault planted"
    if planted.returncode != 1:
        return "error", f"pytest exited {planted.returncode}:\n{_tail(planted.output)}"
    if not planted.fired:
        return "not fired", f"the planted code never ran ({planted.fired} firings)"
    if not re.search(fault.expected, planted.output):
        return "wrong diagnosis", (f"failed without the expected diagnosis /{fault.expected}/:\n"
                                   f"{_tail(planted.output)}")
    if clean is not None and clean.returncode != 0:
        return "false positive", f"fails without the fault too:\n{_tail(clean.output)}"
    return "detected", ""


def run_fault(fault: Fault, *, backend: str, root: Path | None = None) -> FaultRun:
    root = root or checkout_root()
    reason = fault.unplantable(backend)
    if reason:
        return FaultRun(fault.name, "not plantable", fault.detector, 0.0, detail=reason)
    with tempfile.TemporaryDirectory(prefix=f"fault-{fault.name}-") as tmp:
        planted = run_detector(fault.detector, backend=backend, fault=fault.name, root=root,
                               workdir=Path(tmp, "planted"))
        clean = None
        if planted.returncode == 1:
            clean = run_detector(fault.detector, backend=backend, fault=None, root=root,
                                 workdir=Path(tmp, "clean"))
    verdict, detail = judge(fault, planted, clean)
    return FaultRun(fault.name, verdict, fault.detector, round(planted.seconds, 1), planted.fired,
                    detail)


def run_zoo(faults: Iterable[Fault], *, backend: str, jobs: int = 1, root: Path | None = None,
            log: Callable[[str], None] = lambda line: None) -> list[FaultRun]:
    """Every fault's FaultRun, in the order given; `jobs` faults run at a time."""
    faults = list(faults)

    def one(fault: Fault) -> FaultRun:
        result = run_fault(fault, backend=backend, root=root)
        log(f"[faults] {fault.name}: {result.verdict} ({result.seconds:.1f} s)")
        return result

    if jobs <= 1:
        return [one(f) for f in faults]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, faults))


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])
