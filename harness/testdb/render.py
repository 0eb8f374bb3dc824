"""Text forms of a rendered list: the selected lines, and why nothing was selected."""

from __future__ import annotations

from harness.testdb.matching import Machine
from harness.testdb.schema import Condition, TestLine, TestList


def render_lines(lines: list[TestLine]) -> str:
    """One canonical line per test, the form `harness testdb render` prints and pytest args come from."""
    return "".join(f"{line}\n" for line in lines)


def describe_condition(condition: Condition) -> str:
    parts = []
    for key, bound in condition.ranges:
        if bound.gte is not None:
            parts.append(f"{key} >= {bound.gte}")
        if bound.lte is not None:
            parts.append(f"{key} <= {bound.lte}")
    parts += [f"{key} like {' or '.join(patterns)}" for key, patterns in condition.wildcards]
    parts += [f"{key} = {' or '.join(values)}" for key, values in condition.terms]
    return ", ".join(parts) or "always"


def nothing_selected(test_list: TestList, machine: Machine) -> str:
    needs = "; ".join(f"block {i + 1}: {describe_condition(b.condition)}" for i, b in enumerate(test_list.blocks))
    return (f"list {test_list.name!r} ({test_list.source}) selects no tests for {machine}. "
            f"Its blocks need: {needs}. Override facts with --gpu-count, --gpu, --stage, --backend.")
