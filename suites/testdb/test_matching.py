"""Condition matching, selection and rendering against planted machines."""

import pytest

from harness.testdb import Condition, Machine, Range, TestDbError, TestList, matches, parse_line, render_lines, select
from harness.testdb.matching import detect_machine
from harness.testdb.render import nothing_selected
from harness.testdb.schema import Block

CPU = Machine(gpu_count=0, gpu="", stage="pre_merge", backend="emulated")
H200X2 = Machine(gpu_count=2, gpu="NVIDIA H200", stage="pre_merge", backend="cuda")


@pytest.mark.parametrize("condition, cpu, h200x2", [
    (Condition(), True, True),
    (Condition(ranges=(("gpu_count", Range(gte=0, lte=0)),)), True, False),
    (Condition(ranges=(("gpu_count", Range(gte=1)),)), False, True),
    (Condition(ranges=(("gpu_count", Range(lte=1)),)), True, False),
    (Condition(ranges=(("gpu_count", Range(gte=2, lte=2)),)), False, True),
    (Condition(wildcards=(("gpu", ("*h200*",)),)), False, True),  # case-insensitive
    (Condition(wildcards=(("gpu", ("*A100*", "*H2??")),)), False, True),  # any pattern
    (Condition(wildcards=(("gpu", ("*H100*",)),)), False, False),
    (Condition(terms=(("backend", ("emulated",)),)), True, False),
    (Condition(terms=(("stage", ("nightly",)),)), False, False),
    # Every entry must hold: the range matches the H200 machine, the term does not.
    (Condition(ranges=(("gpu_count", Range(gte=1)),), terms=(("backend", ("emulated",)),)), False, False),
])
def test_matches(condition, cpu, h200x2):
    assert (matches(condition, CPU), matches(condition, H200X2)) == (cpu, h200x2)


def demo_list() -> TestList:
    return TestList("demo", "demo.yml", (
        Block(Condition(terms=(("backend", ("emulated",)),)),
              (parse_line("suites/ops"), parse_line('suites/model -m "not slow"'))),
        Block(Condition(ranges=(("gpu_count", Range(gte=1)),)),
              (parse_line("suites/ops"), parse_line("suites/e2e TIMEOUT (60)"))),
    ))


def test_select_keeps_list_order_and_drops_repeats():
    both = Machine(gpu_count=1, gpu="x", stage="pre_merge", backend="emulated")
    assert [str(line) for line in select(demo_list(), both)] == [
        "suites/ops", 'suites/model -m "not slow"', "suites/e2e TIMEOUT (60)"]
    assert [str(line) for line in select(demo_list(), CPU)] == ["suites/ops", 'suites/model -m "not slow"']


def test_render_prints_one_canonical_line_per_test():
    assert render_lines(select(demo_list(), H200X2)) == "suites/ops\nsuites/e2e TIMEOUT (60)\n"


def test_nothing_selected_says_what_the_blocks_need():
    machine = Machine(gpu_count=0, gpu="", stage="nightly", backend="cuda")
    assert select(demo_list(), machine) == []
    message = nothing_selected(demo_list(), machine)
    assert "block 1: backend = emulated; block 2: gpu_count >= 1" in message
    assert "stage=nightly" in message


@pytest.mark.parametrize("facts, says", [
    (dict(gpu_count=-1), "gpu_count -1 must be >= 0"),
    (dict(stage="post_merge"), "stage 'post_merge' is not one of pre_merge, nightly"),
    (dict(backend="tpu"), "backend 'tpu' is not one of emulated, cuda"),
])
def test_machine_rejects_unknown_facts(facts, says):
    with pytest.raises(TestDbError, match=says):
        Machine(**{**dict(gpu_count=0, gpu="", stage="pre_merge", backend="emulated"), **facts})


def test_detect_machine_follows_torch_and_takes_overrides():
    import torch

    here = detect_machine()
    assert here.backend == ("cuda" if torch.cuda.is_available() else "emulated")
    assert here.gpu_count == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert detect_machine(gpu_count=8, gpu="NVIDIA H200", stage="nightly", backend="cuda") == Machine(
        8, "NVIDIA H200", "nightly", "cuda")
