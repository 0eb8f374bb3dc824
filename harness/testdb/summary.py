"""The end of `harness run`: the per-suite table, the failing tests and their reproduction files,
skips by reason, what a timeout or a signal cut, and the same as JSON for CI."""

from __future__ import annotations

import dataclasses
import json
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from harness.testdb.junit import SuiteResult, case_details, format_table, merge, results_by_suite, suite_of
from harness.testdb.matching import Machine
from harness.testdb.schema import TestLine, TestList

PYTEST_EXIT = {2: "interrupted or collection errors", 3: "internal error", 4: "usage error",
               5: "no tests collected"}


@dataclass(frozen=True)
class Outcome:
    invocation: object  # runner.Invocation: its `lines` and `timeout`
    returncode: int | None  # None when killed for its timeout, or never started
    junit: Path
    cut: str | None = None  # "interrupted" or "not started" when a signal stopped the run

    @property
    def timed_out(self) -> bool:
        return self.returncode is None and self.cut is None

    @property
    def lines(self) -> tuple[TestLine, ...]:
        return self.invocation.lines


def report(outcomes: list[Outcome], *, test_list: TestList, machine: Machine, root: Path, merged: Path,
           wall: float, stopped_by: int | None, json_path: Path | None, log: Callable[[str], None],
           missing: tuple[TestLine, ...] = ()) -> int:
    """Print the summary (and write `json_path`); the exit code of the run. A signal that came
    after every test had finished cut nothing: the run is reported as it ended, not as stopped."""
    late_signal = stopped_by if stopped_by is not None and not any(o.cut for o in outcomes) else None
    if late_signal is not None:
        stopped_by = None
    junit_files = [o.junit for o in outcomes if o.junit.is_file()]
    results = results_by_suite(junit_files)
    details = case_details(junit_files, root)
    problems = []
    for outcome in outcomes:
        lines = ", ".join(str(line) for line in outcome.lines)
        if outcome.timed_out:
            line = outcome.lines[0]
            problems.append(f"TIMEOUT after {line.timeout} s: {line}")
            suite = suite_of(line.path)
            results[suite] = results.get(suite, SuiteResult(suite)) + SuiteResult(suite, failed=1)
        elif outcome.cut is None and outcome.returncode not in (0, 1):
            meaning = PYTEST_EXIT.get(outcome.returncode, "unexpected exit code")
            problems.append(f"pytest exited {outcome.returncode} ({meaning}) for: {lines}")
    problems += [f"MISSING {line.path}: no such file or folder; its line was skipped: {line}"
                 for line in missing]
    merge(junit_files, merged)

    log("")
    log(format_table(results))
    for heading, items in (("failed", details.failed), ("reproduction files", details.reproductions)):
        if items:
            log(f"[harness] {heading} ({len(items)}):")
            for item in items:
                log(f"  {'harness repro ' if heading.startswith('repro') else ''}{item}")
    if details.skipped_by_reason:
        log("[harness] skipped, by reason:")
        for reason, count in details.skipped_by_reason.items():
            log(f"  {count:>5}  {reason}")
    for problem in problems:
        log(f"[harness] FAILED {problem}")
    cut = [(i, o) for i, o in enumerate(outcomes, start=1) if o.cut]
    if stopped_by is not None:
        name = signal.Signals(stopped_by).name
        log(f"[harness] stopped by {name}; the table counts the tests done. Cut:")
        for i, outcome in cut:
            log(f"  run {i}/{len(outcomes)} {outcome.cut}: {', '.join(str(line) for line in outcome.lines)}")
    # A timeout (returncode None) and every abnormal exit are also non-zero.
    failed = (any(o.returncode != 0 for o in outcomes if o.cut is None)
              or any(r.failed for r in results.values()) or bool(missing))
    code = 128 + stopped_by if stopped_by is not None else int(failed)
    if late_signal is not None:
        log(f"[harness] {signal.Signals(late_signal).name} came after every test had finished; "
            f"nothing was cut")
    log(f"[harness] JUnit XML: {merged}")
    verdict = f"STOPPED by {signal.Signals(stopped_by).name}" if stopped_by is not None else (
        "FAILED" if failed else "passed")
    log(f"[harness] {verdict} in {wall:.1f} s wall")
    if json_path is not None:
        document = {
            "list": test_list.name, "source": test_list.source, "machine": dataclasses.asdict(machine),
            "root": str(root), "exit_code": code, "wall_s": round(wall, 3), "junit": str(merged),
            "suites": {name: dataclasses.asdict(r) for name, r in sorted(results.items())},
            "failed": list(details.failed), "reproductions": list(details.reproductions),
            "skipped_by_reason": details.skipped_by_reason, "problems": problems,
            "missing": [line.path for line in missing],
            "stopped_by": signal.Signals(stopped_by).name if stopped_by is not None else None,
            "cut": [{"run": i, "state": o.cut, "lines": [str(line) for line in o.lines]} for i, o in cut],
        }
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(document, indent=1) + "\n")
        log(f"[harness] JSON: {json_path}")
    return code
