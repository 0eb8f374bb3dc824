"""Loading lists: a good document, and errors that name the file, the list and the bad key."""

from pathlib import Path

import pytest
import yaml

from harness.testdb import Range, TestDbError, get_list, load_lists
from harness.testdb.loader import load_file

GOOD = """
version: 0.0.1
l0_demo:
- condition:
    ranges: {gpu_count: {gte: 1, lte: 4}}
    wildcards: {gpu: ['*h200*', '*H100*']}
    terms: {stage: pre_merge, backend: [cuda, emulated]}
  tests:
  - suites/ops -m "not slow"
  - suites/e2e TIMEOUT (60)  # long
- tests:
  - suites/model
"""


def write(tmp_path: Path, text: str, name: str = "lists.yml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_good_document_loads_every_field(tmp_path):
    (test_list,) = load_file(write(tmp_path, GOOD))
    assert test_list.name == "l0_demo"
    first, second = test_list.blocks
    assert first.condition.ranges == (("gpu_count", Range(gte=1, lte=4)),)
    assert first.condition.wildcards == (("gpu", ("*h200*", "*H100*")),)
    assert first.condition.terms == (("stage", ("pre_merge",)), ("backend", ("cuda", "emulated")))
    assert [str(t) for t in first.tests] == ['suites/ops -m "not slow"', "suites/e2e TIMEOUT (60)"]
    assert second.condition.ranges == () and [t.test for t in second.tests] == ["suites/model"]


def bad(tmp_path, edit):
    data = yaml.safe_load(GOOD)
    edit(data)
    path = write(tmp_path, yaml.safe_dump(data))
    with pytest.raises(TestDbError) as err:
        load_file(path)
    return str(err.value)


@pytest.mark.parametrize("edit, says", [
    (lambda d: d.pop("version"), "missing `version`"),
    (lambda d: d.update(l0_demo=[]), "list 'l0_demo': must be a non-empty sequence"),
    (lambda d: d["l0_demo"][0].update(when={}), "list 'l0_demo', block 1: unknown key 'when'"),
    (lambda d: d["l0_demo"][0]["condition"].update(range={}), "condition: unknown key 'range'"),
    (lambda d: d["l0_demo"][0]["condition"]["ranges"].update(system_gpu_count={"gte": 1}),
     "condition.ranges: unknown key 'system_gpu_count'; expected gpu_count"),
    (lambda d: d["l0_demo"][0]["condition"]["ranges"]["gpu_count"].update(gte=8),
     "condition.ranges.gpu_count: gte 8 > lte 4"),
    (lambda d: d["l0_demo"][0]["condition"]["ranges"]["gpu_count"].update(gt=1),
     "condition.ranges.gpu_count: unknown key 'gt'"),
    (lambda d: d["l0_demo"][0]["condition"]["ranges"]["gpu_count"].update(lte="four"),
     "condition.ranges.gpu_count.lte: must be an integer, got 'four'"),
    (lambda d: d["l0_demo"][0]["condition"]["terms"].update(stage="post_merge"),
     "condition.terms.stage: unknown value 'post_merge'; expected one of pre_merge, nightly"),
    (lambda d: d["l0_demo"][0]["condition"]["wildcards"].update(gpu=[]),
     "condition.wildcards.gpu: must be a string or a non-empty list"),
    (lambda d: d["l0_demo"][1]["tests"].append("suites/x TIMEOUT 5"),
     "list 'l0_demo', block 2, test 2: line 'suites/x TIMEOUT 5'"),
    (lambda d: d["l0_demo"][1]["tests"].append({"suites/x": 1}), "block 2, test 2: must be a string"),
])
def test_errors_name_file_list_and_key(tmp_path, edit, says):
    message = bad(tmp_path, edit)
    assert message.startswith(str(tmp_path / "lists.yml"))
    assert says in message


def test_invalid_yaml_names_the_file(tmp_path):
    path = write(tmp_path, "version: 1\nl0: [unclosed\n")
    with pytest.raises(TestDbError, match="lists.yml: not valid YAML"):
        load_file(path)


def test_a_list_name_defined_twice_names_both_files(tmp_path):
    write(tmp_path, GOOD, "a.yml")
    write(tmp_path, GOOD, "b.yml")
    with pytest.raises(TestDbError) as err:
        load_lists(tmp_path)
    assert "'l0_demo' is defined in both" in str(err.value)
    assert "a.yml" in str(err.value) and "b.yml" in str(err.value)


def test_unknown_list_name_lists_the_available_ones(tmp_path):
    write(tmp_path, GOOD)
    with pytest.raises(TestDbError, match="no test-db list named 'l0_typo'.*available: l0_demo"):
        get_list(tmp_path, "l0_typo")


def test_the_project_lists_load():
    lists = load_lists(Path(__file__).resolve().parents[2] / "test-db")
    assert {"l0_cpu", "l0_gpu", "nightly_cpu", "nightly_gpu"} <= set(lists)
