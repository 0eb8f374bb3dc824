"""Lists against the suites: every line names tests that exist, and every test is in some list.

A line covers a node id when it is that id, its file, a folder above it, or a parametrised test's
base id. -k/-m filters are ignored here: they narrow a line, they do not make it name something else.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.testdb.child_pytest import plugin_arguments
from harness.testdb.schema import TestDbError, TestLine, TestList


@dataclass(frozen=True)
class CoverageReport:
    missing: tuple[tuple[str, TestLine], ...]  # (list name, line) naming no collected test
    uncovered: tuple[str, ...]  # node ids no line of any list covers

    @property
    def ok(self) -> bool:
        return not self.missing and not self.uncovered

    def __str__(self) -> str:
        if self.ok:
            return "every list line names existing tests, and every test is in a list"
        out = [f"list {name!r} names no existing test: {line}" for name, line in self.missing]
        out += [f"test in no list: {node_id}" for node_id in self.uncovered]
        return "\n".join(out)


def covers(line: TestLine, node_id: str) -> bool:
    test = line.test.rstrip("/").removeprefix("./")
    return node_id == test or node_id.startswith((test + "::", test + "[", test + "/"))


def check_coverage(lists: dict[str, TestList], node_ids: list[str]) -> CoverageReport:
    lines = [(name, line) for name, test_list in lists.items()
             for block in test_list.blocks for line in block.tests]
    missing = tuple((name, line) for name, line in lines if not any(covers(line, n) for n in node_ids))
    uncovered = tuple(n for n in node_ids if not any(covers(line, n) for _, line in lines))
    return CoverageReport(missing=missing, uncovered=uncovered)


def folders_named(lists: dict[str, TestList]) -> tuple[str, ...]:
    """The top-level folders (or files) the lines of `lists` name: what the coverage check collects,
    so that a test in a folder of the lists but in no line is found."""
    tops = {line.path.removeprefix("./").split("/")[0] for test_list in lists.values()
            for block in test_list.blocks for line in block.tests}
    return tuple(sorted(tops))


def collect_node_ids(root: Path, paths: tuple[str, ...] = ("suites",)) -> list[str]:
    """The node ids pytest collects under `paths`, from `pytest --collect-only -q` in a subprocess
    (a fresh process: collection imports every test module)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    cmd = [sys.executable, "-m", "pytest", *plugin_arguments(env), "--collect-only", "-q", "-p",
           "no:xdist", *paths]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 5):  # 5: nothing collected, which the coverage check reports
        raise TestDbError(f"collecting {' '.join(paths)} failed with exit code {proc.returncode}:\n"
                          f"{proc.stdout[-4000:]}{proc.stderr[-2000:]}")
    return [line.strip() for line in proc.stdout.splitlines() if "::" in line and not line.startswith(" ")]
