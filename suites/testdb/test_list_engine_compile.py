"""A test-db block that runs its suites' engines on the compiled path (`engine_compile: inductor`):
loaded, shown, grouped into a pytest process of its own and passed as `--engine-compile`, so one
list runs the runtime suites on both paths."""

import pytest

from harness.testdb import TestDbError
from harness.testdb.loader import load_file
from harness.testdb.runner import plan, pytest_command

LIST = """
version: 0.0.1
mine:
- engine_compile: inductor
  tests:
  - suites/decoder
- tests:
  - suites/decoder
"""


def load(tmp_path, text):
    path = tmp_path / "lists.yml"
    path.write_text(text)
    (test_list,) = load_file(path)
    return test_list


def test_a_block_field_runs_its_lines_with_the_engine_compile_option(tmp_path):
    compiled, eager = load(tmp_path, LIST).blocks
    assert compiled.tests[0].engine_compile == "inductor" and eager.tests[0].engine_compile is None
    assert str(compiled.tests[0]) == "suites/decoder # engines compile=inductor"
    commands = [pytest_command(inv, backend="emulated", junit=tmp_path / "1.xml", workers=0)
                for inv in plan([compiled.tests[0], eager.tests[0]])]
    assert len(commands) == 2, "the two paths of one suite must run in two pytest processes"
    with_option = [c for c in commands if "--engine-compile" in c]
    assert len(with_option) == 1
    assert with_option[0][with_option[0].index("--engine-compile") + 1] == "inductor"


def test_an_unknown_engine_compile_names_the_block_and_the_value(tmp_path):
    with pytest.raises(TestDbError, match=r"list 'mine', block 1: engine_compile must be one of "
                                          r"\['none', 'inductor'\], got 'max-autotune'"):
        load(tmp_path, "version: 1\nmine:\n- engine_compile: max-autotune\n  tests: [suites]\n")
