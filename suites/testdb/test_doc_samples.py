"""Documented CLI samples against real output: the user guide's `harness run` sample has the shape
the runner prints today, and the size the docs give the example runtime is its size."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from harness.testdb import Condition, Machine, TestList, parse_line
from harness.testdb.runner import run_list
from harness.testdb.schema import Block

ROOT = Path(__file__).resolve().parents[2]

# The kinds of line `harness run` prints around pytest's own output.
LINE_KINDS = {
    "start": r"\[harness\] \S+ \(\S+\) on gpu_count=\d+ gpu='[^']*' stage=\w+ backend=\w+: \d+ lines in \d+ "
             r"pytest run\(s\), rooted at \S+",
    "run": r"\[harness\] run \d+/\d+: python -m pytest .+ --graph-backend=\w+ --junitxml=\S+( .+)?",
    "table head": r"suite +passed +failed +skipped +seconds",
    "table row": r"\w+ +\d+ +\d+ +\d+ +\d+\.\d",
    "table rule": r"-+",
    "skip head": r"\[harness\] skipped, by reason:",
    "skip row": r" +\d+  .+",
    "junit": r"\[harness\] JUnit XML: \S+",
    "verdict": r"\[harness\] (passed|FAILED) in \d+\.\d s wall",
}


def kind_of(line: str) -> str | None:
    return next((kind for kind, pattern in LINE_KINDS.items() if re.fullmatch(pattern, line)), None)


def documented_run_sample() -> list[str]:
    guide = (ROOT / "docs" / "user-guide.md").read_text()
    block = re.search(r"```\n\$ scripts/harness run l0_cpu\n(.*?)```", guide, re.DOTALL)
    assert block, "the user guide's `harness run` sample is gone"
    return [line for line in block.group(1).splitlines() if not line.startswith("...")]


def test_the_user_guides_run_sample_has_the_shape_of_a_real_run(tmp_path, capsys):
    (tmp_path / "suites" / "demo").mkdir(parents=True)
    (tmp_path / "suites" / "demo" / "test_demo.py").write_text(textwrap.dedent('''
        import pytest

        def test_passes():
            pass

        @pytest.mark.skip(reason="planted skip")
        def test_skipped():
            pass
    '''))
    test_list = TestList("demo", "demo.yml", (Block(Condition(), (parse_line('suites/demo -m "not slow"'),)),))
    machine = Machine(gpu_count=0, gpu="", stage="pre_merge", backend="emulated")
    assert run_list(test_list, machine, root=tmp_path, results_dir=tmp_path / "results",
                    extra_args=("-p", "no:cacheprovider")) == 0
    real = [kind_of(line) for line in capsys.readouterr().out.splitlines()]

    documented = documented_run_sample()
    unknown = [line for line in documented if kind_of(line) is None]
    assert not unknown, f"lines of the documented sample that `harness run` does not print: {unknown}"
    missing = {kind_of(line) for line in documented} - set(real)
    assert not missing, f"the documented sample shows line kinds a real run did not print: {missing}"
    order = [kind for kind in real if kind is not None]
    assert [kind_of(line) for line in documented if kind_of(line) in ("start", "table head", "junit", "verdict")] \
        == [kind for kind in order if kind in ("start", "table head", "junit", "verdict")]


def test_the_example_runtime_is_as_long_as_the_docs_say():
    text = (ROOT / "docs" / "testing-your-runtime.md").read_text()
    claimed = re.search(r"an? (\d+)-line runtime", text)
    assert claimed, "docs/testing-your-runtime.md no longer says how long the example runtime is"
    lines = len((ROOT / "examples" / "my_runtime" / "my_runtime.py").read_text().splitlines())
    assert int(claimed.group(1)) == lines


def test_last_failed_works_in_this_project_as_the_user_guide_advises(tmp_path):
    """`harness run l0_cpu -- -x --lf`: under this project's pytest configuration, a second run with
    --lf runs only the test that failed."""
    (tmp_path / "test_lf.py").write_text("def test_passes():\n    pass\n\n\ndef test_fails():\n    assert False\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    cmd = [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
           "-p", "no:xdist", "--repro-dir", "none", "-q", str(tmp_path / "test_lf.py")]
    first = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert "1 failed, 1 passed" in first.stdout, first.stdout[-2000:]
    again = subprocess.run([*cmd, "--lf"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert "1 failed, 1 deselected" in again.stdout, again.stdout[-2000:]
