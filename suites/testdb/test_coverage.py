"""Every list line names existing tests and every test of suites/ is in some list."""

from pathlib import Path

import pytest

from harness.testdb import Condition, TestList, check_coverage, collect_node_ids, load_lists, parse_line
from harness.testdb.coverage import covers
from harness.testdb.schema import Block

ROOT = Path(__file__).resolve().parents[2]
NODE_IDS = [
    "suites/ops/test_kv.py::test_alloc[4]",
    "suites/ops/test_kv.py::TestFree::test_free",
    "suites/ops_extra/test_x.py::test_x",
    "suites/model/test_llama.py::test_logits",
]


def one_list(*texts):
    return {"demo": TestList("demo", "demo.yml", (Block(Condition(), tuple(parse_line(t) for t in texts)),))}


def test_covers_by_folder_file_node_id_and_parametrised_base():
    assert covers(parse_line("suites/ops"), NODE_IDS[0])
    assert covers(parse_line("suites/ops/"), NODE_IDS[0])
    assert covers(parse_line("suites/ops/test_kv.py"), NODE_IDS[1])
    assert covers(parse_line("suites/ops/test_kv.py::TestFree"), NODE_IDS[1])
    assert covers(parse_line("suites/ops/test_kv.py::test_alloc"), NODE_IDS[0])
    assert not covers(parse_line("suites/ops"), "suites/ops_extra/test_x.py::test_x")  # a prefix, not a folder
    assert not covers(parse_line("suites/ops/test_kv.py::test_all"), NODE_IDS[0])


def test_complete_lists_pass():
    report = check_coverage(one_list("suites/ops", "suites/ops_extra -m 'not slow'", "suites/model"), NODE_IDS)
    assert report.ok, str(report)


def test_a_test_in_no_list_is_reported():
    report = check_coverage(one_list("suites/ops", "suites/ops_extra"), NODE_IDS)
    assert report.uncovered == ("suites/model/test_llama.py::test_logits",)
    assert "test in no list: suites/model/test_llama.py::test_logits" in str(report)


def test_a_line_naming_no_test_is_reported():
    report = check_coverage(one_list("suites", "suites/ops/test_kv.py::test_gone", "suites/decoder"), NODE_IDS)
    assert [str(line) for _, line in report.missing] == ["suites/ops/test_kv.py::test_gone", "suites/decoder"]
    assert "list 'demo' names no existing test: suites/decoder" in str(report)


@pytest.mark.slow  # collects every suite in a subprocess; the folder check below is pre-merge
def test_project_lists_cover_exactly_the_collected_suites():
    node_ids = collect_node_ids(ROOT)
    assert any(n.startswith("suites/testdb/test_coverage.py::") for n in node_ids)
    report = check_coverage(load_lists(ROOT / "test-db"), node_ids)
    assert report.ok, f"\n{report}"


@pytest.mark.parametrize("name", ["l0_cpu", "nightly_cpu"])
def test_every_suite_folder_is_named_by_the_cpu_lists(name):
    """Without collecting: a new folder under suites/ holding tests fails here until listed."""
    folders = sorted(p.name for p in (ROOT / "suites").iterdir()
                     if p.is_dir() and any(p.rglob("test_*.py")))
    lines = [line for block in load_lists(ROOT / "test-db")[name].blocks for line in block.tests]
    unlisted = [f for f in folders if not any(covers(line, f"suites/{f}/test_x.py::t") for line in lines)]
    assert unlisted == [], f"suites/ folders not in {name}: {unlisted}"
