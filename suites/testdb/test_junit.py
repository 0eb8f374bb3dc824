"""Per-suite counts from JUnit XML, the merge of several files, and the summary table."""

import xml.etree.ElementTree as ET

from harness.testdb.junit import SuiteResult, format_table, merge, results_by_suite, suite_of

# The shapes pytest writes: classname from the node id, a collection error with only a name.
JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
  <testcase classname="suites.ops.test_kv" name="test_a" time="1.5"/>
  <testcase classname="suites.ops.test_kv.TestB" name="test_b[2]" time="0.5"><failure message="x"/></testcase>
  <testcase classname="suites.ops.test_kv" name="test_c" time="0"><skipped message="needs CUDA"/></testcase>
  <testcase classname="suites.model.test_m" name="test_d" time="2.0"><error message="setup"/></testcase>
  <testcase classname="" name="suites.e2e.test_broken" time="0"><error message="collection failure"/></testcase>
</testsuite></testsuites>
"""


def test_suite_is_the_folder_under_suites():
    assert suite_of("suites/ops/test_kv.py") == "ops"
    assert suite_of("suites/ops") == "ops"
    assert suite_of("tests/test_x.py") == "tests"


def test_results_count_failures_errors_and_skips_per_suite(tmp_path):
    path = tmp_path / "a.xml"
    path.write_text(JUNIT)
    assert results_by_suite([path]) == {
        "ops": SuiteResult("ops", passed=1, failed=1, skipped=1, seconds=2.0),
        "model": SuiteResult("model", failed=1, seconds=2.0),
        "e2e": SuiteResult("e2e", failed=1),
    }


def test_merge_keeps_every_testcase(tmp_path):
    (tmp_path / "1.xml").write_text(JUNIT)
    (tmp_path / "2.xml").write_text(JUNIT)
    merged = merge([tmp_path / "1.xml", tmp_path / "2.xml"], tmp_path / "all.xml")
    assert len(list(ET.parse(merged).getroot().iter("testcase"))) == 10
    assert results_by_suite([merged])["ops"] == SuiteResult("ops", passed=2, failed=2, skipped=2, seconds=4.0)


def test_table_has_a_row_per_suite_and_a_total():
    table = format_table({"ops": SuiteResult("ops", 3, 1, 2, 1.25), "e2e": SuiteResult("e2e", 1, 0, 0, 4.0)})
    rows = [line.split() for line in table.splitlines()]
    assert rows[0] == ["suite", "passed", "failed", "skipped", "seconds"]
    assert rows[1] == ["e2e", "1", "0", "0", "4.0"]
    assert rows[2] == ["ops", "3", "1", "2", "1.2"]
    assert rows[4] == ["total", "4", "1", "2", "5.2"]
