"""Load test-db YAML files into TestLists, with errors that name the file, the list and the bad key."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from harness.device_options import DeviceOptionError, device_from_mapping
from harness.testdb.schema import (
    RANGE_KEYS, TERM_VALUES, WILDCARD_KEYS, Block, Condition, Range, TestDbError, TestList, parse_line,
)

CONDITION_KEYS = ("ranges", "wildcards", "terms")
BLOCK_KEYS = ("condition", "tests", "emulate_cuda", "engine_compile")
# A block's `engine_compile`: EngineConfig.compile for the engines its suites build (pytest
# --engine-compile), so a list runs the runtime suites on both paths.
ENGINE_COMPILE_VALUES = ("none", "inductor")


def project_root(start: Path | None = None) -> Path:
    """The nearest folder at or above `start` (default: the working directory) holding a test-db/
    folder; else the checkout this package was installed from."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "test-db").is_dir():
            return folder
    return Path(__file__).resolve().parents[2]


def load_lists(testdb_dir: Path) -> dict[str, TestList]:
    """Every list of every *.yml / *.yaml file in `testdb_dir`, by name; names are unique across files."""
    files = sorted([*testdb_dir.glob("*.yml"), *testdb_dir.glob("*.yaml")])
    if not files:
        raise TestDbError(f"no *.yml test-db files in {testdb_dir}")
    lists: dict[str, TestList] = {}
    for path in files:
        for test_list in load_file(path):
            if test_list.name in lists:
                raise TestDbError(f"list {test_list.name!r} is defined in both "
                                  f"{lists[test_list.name].source} and {test_list.source}")
            lists[test_list.name] = test_list
    return lists


def get_list(testdb_dir: Path, name: str) -> TestList:
    lists = load_lists(testdb_dir)
    if name not in lists:
        raise TestDbError(f"no test-db list named {name!r} in {testdb_dir}; "
                          f"available: {', '.join(sorted(lists)) or 'none'}")
    return lists[name]


def load_file(path: Path) -> list[TestList]:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise TestDbError(f"{path}: not valid YAML: {err}") from None
    return parse_document(data, source=str(path))


def parse_document(data: Any, *, source: str) -> list[TestList]:
    if not isinstance(data, dict):
        raise TestDbError(f"{source}: top level must be a mapping of `version` and named lists, "
                          f"got {type(data).__name__}")
    if "version" not in data:
        raise TestDbError(f"{source}: missing `version`")
    lists = []
    for name, blocks in data.items():
        if name == "version":
            continue
        where = f"{source}: list {name!r}"
        if not isinstance(blocks, list) or not blocks:
            raise TestDbError(f"{where}: must be a non-empty sequence of {{condition, tests}} blocks")
        lists.append(TestList(name=str(name), source=source,
                              blocks=tuple(_block(b, f"{where}, block {i + 1}") for i, b in enumerate(blocks))))
    return lists


def _block(data: Any, where: str) -> Block:
    _check_mapping(data, BLOCK_KEYS, where)
    tests = data.get("tests")
    if not isinstance(tests, list) or not tests:
        raise TestDbError(f"{where}: `tests` must be a non-empty sequence of test lines")
    lines = []
    for i, text in enumerate(tests):
        if not isinstance(text, str):
            raise TestDbError(f"{where}, test {i + 1}: must be a string, got {text!r}")
        try:
            lines.append(parse_line(text))
        except TestDbError as err:
            raise TestDbError(f"{where}, test {i + 1}: {err}") from None
    try:
        emulation = device_from_mapping(data.get("emulate_cuda"), where=f"{where}: emulate_cuda")
    except DeviceOptionError as err:
        raise TestDbError(str(err)) from None
    if emulation is not None:  # each line carries it, so `harness run` groups and passes it
        lines = [dataclasses.replace(line, emulation=emulation) for line in lines]
    engine_compile = data.get("engine_compile")
    if engine_compile is not None:
        if engine_compile not in ENGINE_COMPILE_VALUES:
            raise TestDbError(f"{where}: engine_compile must be one of {list(ENGINE_COMPILE_VALUES)}, "
                              f"got {engine_compile!r}")
        lines = [dataclasses.replace(line, engine_compile=engine_compile) for line in lines]
    return Block(condition=_condition(data.get("condition") or {}, f"{where}: condition"),
                 tests=tuple(lines), emulation=emulation, engine_compile=engine_compile)


def _condition(data: Any, where: str) -> Condition:
    _check_mapping(data, CONDITION_KEYS, where)
    ranges = _check_mapping(data.get("ranges") or {}, RANGE_KEYS, f"{where}.ranges")
    wildcards = _check_mapping(data.get("wildcards") or {}, WILDCARD_KEYS, f"{where}.wildcards")
    terms = _check_mapping(data.get("terms") or {}, tuple(TERM_VALUES), f"{where}.terms")
    return Condition(
        ranges=tuple((key, _range(value, f"{where}.ranges.{key}")) for key, value in ranges.items()),
        wildcards=tuple((key, _strings(value, f"{where}.wildcards.{key}")) for key, value in wildcards.items()),
        terms=tuple((key, _term(key, value, f"{where}.terms.{key}")) for key, value in terms.items()),
    )


def _range(data: Any, where: str) -> Range:
    _check_mapping(data, ("gte", "lte"), where)
    bounds = {}
    for key, value in data.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise TestDbError(f"{where}.{key}: must be an integer, got {value!r}")
        bounds[key] = value
    if not bounds:
        raise TestDbError(f"{where}: needs gte, lte or both")
    bound = Range(**bounds)
    if bound.gte is not None and bound.lte is not None and bound.gte > bound.lte:
        raise TestDbError(f"{where}: gte {bound.gte} > lte {bound.lte}, so no machine matches")
    return bound


def _term(key: str, data: Any, where: str) -> tuple[str, ...]:
    values = _strings(data, where)
    for value in values:
        if value not in TERM_VALUES[key]:
            raise TestDbError(f"{where}: unknown value {value!r}; expected one of {', '.join(TERM_VALUES[key])}")
    return values


def _strings(data: Any, where: str) -> tuple[str, ...]:
    values = [data] if isinstance(data, str) else data
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        raise TestDbError(f"{where}: must be a string or a non-empty list of strings, got {data!r}")
    return tuple(values)


def _check_mapping(data: Any, allowed: tuple[str, ...], where: str) -> dict:
    if not isinstance(data, dict):
        raise TestDbError(f"{where}: must be a mapping, got {data!r}")
    for key in data:
        if key not in allowed:
            raise TestDbError(f"{where}: unknown key {key!r}; expected {', '.join(allowed)}")
    return data
