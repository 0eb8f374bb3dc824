"""Reproduction records: the file format, names, Hypothesis examples, and bad files."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fixtures.models import TINY_ENGINE_CONFIG, mixed_requests
from harness.cli import main
from harness.runtime import EngineConfig
from harness.repro import ReproRecord, Scenario, file_name, hypothesis_example, load_record, write_record


def test_record_round_trips_through_its_file(tmp_path):
    config = replace(TINY_ENGINE_CONFIG, decode_graph_sizes=(4, 8), piecewise_buckets=(16,),
                     single_pass_capture=True, graph_top_k=(2,))
    scenario = Scenario(backend="emulated", model_seed=3, engine=config.to_dict(),
                        requests=tuple(mixed_requests()[:2]), tolerance_steps=0)
    record = ReproRecord(node_id="suites/x/test_y.py::test_z[a-1]", backend="emulated", torch="2.x",
                         root=str(tmp_path), pytest_options=("--graph-backend=emulated",),
                         seeds={"hypothesis_seed": 5}, hypothesis_example="Falsifying example: f(x=1)",
                         fault="metadata-rebound", scenario=scenario, failure="E  boom")
    path = write_record(record, tmp_path / "repro")
    assert path.name == "suites_x_test_y.py__test_z_a-1_.json"
    assert load_record(path) == record
    assert json.loads(path.read_text())["scenario"]["engine"]["max_model_len"] == 128
    assert EngineConfig.from_dict(load_record(path).scenario.engine) == config


def test_file_name_keeps_only_safe_characters():
    assert file_name("suites/a.py::T::t[x/y z]") == "suites_a.py__T__t_x_y_z_.json"


def test_hypothesis_example_is_cut_from_the_failure_text():
    text = "E   assert 1 == 2\nE   Falsifying example: test_f(\nE       x=3,\nE   )\n\nmore"
    assert hypothesis_example(text) == "E   Falsifying example: test_f(\nE       x=3,\nE   )"
    assert hypothesis_example("E   assert False") is None


def test_a_bad_file_is_exit_code_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": 99}')
    assert main(["repro", str(bad)]) == 2
    assert "is not a reproduction file" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown scenario fields"):
        Scenario.from_dict({"backend": "emulated", "model_seed": 0, "engine": {}, "requests": [],
                            "extra": 1})


def test_hypothesis_example_inside_an_exception_group():
    text = ("  | ExceptionGroup: Hypothesis found 2 distinct failures.\n"
            "    | ValueError: bad\n    | Failing test case: test_f(\n    |     x=[],\n    | )\n"
            "    +---- 2 ----\n    | Failing test case: test_f(\n    |     x=[1],\n    | )\n")
    assert hypothesis_example(text) == "| Failing test case: test_f(\n    |     x=[],\n    | )"
