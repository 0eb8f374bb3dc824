"""Parsing of test lines: the forms a list may use, and the ones it may not."""

import pytest

from harness.testdb import TestDbError, TestLine, parse_line


@pytest.mark.parametrize("text, expected", [
    ("suites/ops", TestLine("suites/ops")),
    ("suites/ops/test_kv.py::test_alloc[4-8]", TestLine("suites/ops/test_kv.py::test_alloc[4-8]")),
    ('suites/ops -k "kv and not big" -m "not slow"', TestLine("suites/ops", keyword="kv and not big", marker="not slow")),
    ("suites/e2e -m gpu TIMEOUT (90) # long one", TestLine("suites/e2e", marker="gpu", timeout=90)),
    ("suites/e2e   # only a comment", TestLine("suites/e2e")),
])
def test_parse_line_accepts(text, expected):
    assert parse_line(text) == expected


@pytest.mark.parametrize("text, says", [
    ("", "does not start with a test id"),
    ("-m gpu", "does not start with a test id"),
    ("/abs/suites/ops", "must be relative"),
    ("suites/ops -m", "-m needs an expression"),
    ("suites/ops -k a -k b", "-k given twice"),
    ("suites/ops TIMEOUT 90", "TIMEOUT must appear once, as TIMEOUT (seconds)"),
    ("suites/ops TIMEOUT (0)", "at least 1 second"),
    ("suites/ops TIMEOUT (5) TIMEOUT (6)", "TIMEOUT must appear once"),
    ("suites/ops --maxfail 2", "unexpected '--maxfail'"),
    ('suites/ops -k "unbalanced', "No closing quotation"),
])
def test_parse_line_rejects(text, says):
    with pytest.raises(TestDbError) as err:
        parse_line(text)
    assert says in str(err.value)


@pytest.mark.parametrize("text", [
    'suites/ops -k "a and not b" -m "not slow" TIMEOUT (30)',
    "suites/ops/test_x.py::test_y[1-2]",
    """suites/ops -k 'name == "x"'""",
])
def test_canonical_text_parses_back_to_the_same_line(text):
    line = parse_line(text)
    assert parse_line(str(line)) == line


def test_path_is_the_file_part_of_a_node_id():
    assert parse_line("suites/ops/test_kv.py::TestA::test_b").path == "suites/ops/test_kv.py"
