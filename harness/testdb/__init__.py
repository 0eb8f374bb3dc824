"""test-db: named test lists with conditions (schema, loader, matching, rendering, running)."""

from harness.testdb.coverage import CoverageReport, check_coverage, collect_node_ids
from harness.testdb.loader import get_list, load_lists, project_root
from harness.testdb.matching import Machine, detect_machine, matches, select
from harness.testdb.render import render_lines
from harness.testdb.runner import run_list
from harness.testdb.schema import Condition, Range, TestDbError, TestLine, TestList, parse_line

__all__ = [
    "Condition", "CoverageReport", "Machine", "Range", "TestDbError", "TestLine", "TestList",
    "check_coverage", "collect_node_ids", "detect_machine", "get_list", "load_lists", "matches",
    "parse_line", "project_root", "render_lines", "run_list", "select",
]
