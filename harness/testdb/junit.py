"""Per-suite results from pytest's JUnit XML: counting, merging files, and the summary table."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

TOTAL = "total"


@dataclass(frozen=True)
class SuiteResult:
    suite: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0

    def __add__(self, other: SuiteResult) -> SuiteResult:
        return SuiteResult(self.suite, self.passed + other.passed, self.failed + other.failed,
                           self.skipped + other.skipped, self.seconds + other.seconds)


def suite_of(test_path: str) -> str:
    """The suite a test belongs to: the folder under suites/ (else the first folder of its path)."""
    parts = [p for p in test_path.replace("\\", "/").split("/") if p and p != "."]
    if len(parts) > 1 and parts[0] == "suites":
        return parts[1]
    return parts[0] if parts else "?"


def _testcase_path(case: ET.Element) -> str:
    # pytest writes classname "suites.ops.test_x[.Class]"; a collection error has no classname and
    # carries the module in name instead.
    dotted = case.get("classname") or case.get("name", "")
    return dotted.replace(".", "/")


def test_cases(path: Path) -> list[ET.Element]:
    """The <testcase>s of a JUnit file, less the nameless one xdist leaves for a test cut short by
    an interrupt (what a stopped run cut is reported apart)."""
    return [case for case in ET.parse(path).getroot().iter("testcase") if case.get("classname") or case.get("name")]


def results_by_suite(junit_files: list[Path]) -> dict[str, SuiteResult]:
    results: dict[str, SuiteResult] = {}
    for path in junit_files:
        for case in test_cases(path):
            tags = {child.tag for child in case}
            failed = bool(tags & {"failure", "error"})
            skipped = "skipped" in tags and not failed
            one = SuiteResult(suite_of(_testcase_path(case)), passed=int(not (failed or skipped)),
                              failed=int(failed), skipped=int(skipped),
                              seconds=float(case.get("time") or 0.0))
            results[one.suite] = results.get(one.suite, SuiteResult(one.suite)) + one
    return results


@dataclass(frozen=True)
class CaseDetails:
    """What a CI reader looks for beyond the counts: which tests failed, the reproduction files they
    wrote (the plugin's `reproduction` property), and why tests were skipped."""

    failed: tuple[str, ...] = ()
    reproductions: tuple[str, ...] = ()
    skipped_by_reason: dict[str, int] = field(default_factory=dict)


def node_id(case: ET.Element, root: Path) -> str:
    """The pytest node id of a JUnit test case: the dotted classname back to its file under `root`."""
    parts = (case.get("classname") or "").split(".")
    name = case.get("name", "")
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if (root / path).is_file():
            return "::".join([path, *parts[cut:], name])
    return "::".join([p for p in (case.get("classname"), name) if p])


def case_details(junit_files: list[Path], root: Path) -> CaseDetails:
    failed, reproductions, skipped = [], [], Counter()
    for path in junit_files:
        for case in test_cases(path):
            problems = [child for child in case if child.tag in ("failure", "error")]
            if problems:
                failed.append(node_id(case, root))
            else:
                for child in case.iter("skipped"):
                    skipped[_skip_reason(child)] += 1
            reproductions += [prop.get("value", "") for prop in case.iter("property")
                              if prop.get("name") == "reproduction"]
    return CaseDetails(tuple(failed), tuple(reproductions), dict(skipped.most_common()))


def _skip_reason(skipped: ET.Element) -> str:
    # pytest writes "reason" or "xfail-reason"; a skip with no reason keeps pytest's own wording.
    message = skipped.get("message") or skipped.get("type") or "no reason given"
    return message.removeprefix("Skipped: ")


def merge(junit_files: list[Path], target: Path) -> Path:
    """Concatenate the <testsuite> elements of several JUnit files into one <testsuites> file."""
    merged = ET.Element("testsuites")
    for path in junit_files:
        root = ET.parse(path).getroot()
        merged.extend(root.iter("testsuite") if root.tag == "testsuites" else [root])
    ET.ElementTree(merged).write(target, encoding="utf-8", xml_declaration=True)
    return target


def format_table(results: dict[str, SuiteResult]) -> str:
    rows = [results[name] for name in sorted(results)]
    total = SuiteResult(TOTAL)
    for row in rows:
        total = total + row
    width = max([len(TOTAL), *(len(r.suite) for r in rows)])
    lines = [f"{'suite':<{width}}  {'passed':>6}  {'failed':>6}  {'skipped':>7}  {'seconds':>8}"]
    for row in [*rows, total]:
        lines.append(f"{row.suite:<{width}}  {row.passed:>6}  {row.failed:>6}  {row.skipped:>7}  {row.seconds:>8.1f}")
    lines.insert(len(lines) - 1, "-" * len(lines[0]))
    return "\n".join(lines)
