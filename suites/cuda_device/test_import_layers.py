"""The imports of harness/ point one way (DESIGN.md, docs/architecture.md), counting imports inside
functions as much as those at the top of a module: the graph backends use only the emulated
device's public face (`harness.emulation.emulation_active`, imported where it is used); the device
uses the graph emulator below it and nothing above; and inside harness/emulation no two modules
import each other, directly or round a circle."""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass

import harness

HARNESS = pathlib.Path(harness.__file__).parent
# the bottom layer: these import no harness module but one another
STANDALONE = ("harness.records", "harness.internals_findings", "harness.torch_internals",
              "harness.triton_internals", "harness.provenance")
# graphs' lower half, which the emulated device builds on: the contract's types, pointer
# snapshots and the graph emulator's internals
GRAPHS_BELOW = ("harness.graphs.base", "harness.graphs.pointers", "harness.graphs.emulator")
GRAPHS_ABOVE = ("harness.graphs", "harness.graphs.cuda", "harness.graphs.emulated")
DEVICE_FACE = "harness.emulation"  # imported by the backends for emulation_active only


@dataclass(frozen=True)
class Edge:
    source: str  # the importing module
    target: str  # the harness module imported (a name imported from a package counts as it)
    names: tuple[str, ...]  # the names taken from it ('*' for a plain import)
    line: int
    lazy: bool  # inside a function or method

    def __str__(self) -> str:
        where = "in a function" if self.lazy else "at module level"
        return f"{self.source}:{self.line} imports {self.target} ({', '.join(self.names)}) {where}"


def _module_names() -> dict[str, pathlib.Path]:
    out = {}
    for path in HARNESS.rglob("*.py"):
        parts = list(path.relative_to(HARNESS.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_edges(modules: dict[str, str]) -> list[Edge]:
    """Every import of a harness module in `modules` (name -> source), top-level or not."""
    edges = []
    for name, source in modules.items():
        tree = ast.parse(source)
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "harness":
                        edges.append(Edge(name, alias.name, ("*",), node.lineno, id(node) not in top))
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "harness":
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    target = full if full in modules else node.module
                    edges.append(Edge(name, target, (alias.name,), node.lineno, id(node) not in top))
    return edges


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def layer_violations(edges: list[Edge]) -> list[str]:
    found = []
    for e in edges:
        s, t = e.source, e.target
        if _within(s, STANDALONE):
            if not _within(t, STANDALONE):
                found.append(f"{e}: {s} stands alone")
        elif _within(s, GRAPHS_BELOW) and not (_within(t, GRAPHS_BELOW) or _within(t, STANDALONE)):
            found.append(f"{e}: the graph emulator imports only its own part of graphs")
        elif s in GRAPHS_ABOVE or (_within(s, ("harness.graphs",)) and not _within(s, GRAPHS_BELOW)):
            if _within(t, ("harness.emulation",)) and not (
                    t == DEVICE_FACE and e.names == ("emulation_active",) and e.lazy):
                found.append(f"{e}: graphs take only emulation_active from {DEVICE_FACE}, "
                             f"inside the function that needs it")
            elif not _within(t, ("harness.graphs", "harness.emulation") + STANDALONE):
                found.append(f"{e}: graphs use only torch and the device's public face")
        elif _within(s, ("harness.emulation",)) and not (
                _within(t, ("harness.emulation",) + GRAPHS_BELOW + STANDALONE)):
            found.append(f"{e}: the emulated device uses the graph emulator, nothing above it")
        elif _within(s, ("harness.runtime", "harness.adapters")) and _within(
                t, ("harness.check", "harness.faults")):
            found.append(f"{e}: runtime and adapters never import check or faults")
    return found


def cycles(edges: list[Edge], prefix: str) -> list[list[str]]:
    """The import circles (strongly connected sets of two or more modules) under `prefix`."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        if _within(e.source, (prefix,)) and _within(e.target, (prefix,)) and e.source != e.target:
            graph.setdefault(e.source, set()).add(e.target)
            graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _harness_edges() -> list[Edge]:
    return import_edges({name: path.read_text() for name, path in _module_names().items()})


def test_the_layers_of_harness_point_one_way():
    problems = layer_violations(_harness_edges())
    assert not problems, "imports against the layer order:\n" + "\n".join(problems)


def test_no_circle_inside_the_emulated_device():
    assert cycles(_harness_edges(), "harness.emulation") == []


def test_no_circle_anywhere_in_harness():
    # Function-level imports count: a deferred import hides a circle from the interpreter, not
    # from a reader (ops.attention and ops.decode_attention were one until paged_context.py).
    assert cycles(_harness_edges(), "harness") == []


# --- the checks themselves, on planted imports ------------------------------------------------

PLANTED = {
    "harness.emulation.session": "from harness.emulation.state import DeviceState\n",
    "harness.emulation.state": "def f():\n    from harness.emulation.streams import Stream\n",
    "harness.emulation.streams": "def g():\n    from harness.emulation.session import active\n",
    "harness.emulation.placement": "from harness.graphs.emulated import EmulatedGraph\n",
    "harness.graphs.cuda": "def h():\n    from harness.emulation.session import emulation_active\n",
    "harness.graphs.emulated": "from harness.emulation import emulation_active\n",
    "harness.graphs.emulator.recorder": "def k():\n    from harness.emulation import emulation_active\n",
    "harness.graphs": "def m():\n    from harness.emulation import emulation_active\n",
    "harness.runtime.engine": "from harness.check.compare import compare_generations\n",
    "harness.emulation": "from harness.emulation.session import emulate_cuda\n",
    "harness.check.compare": "", "harness.graphs.emulator": "",
}


def test_a_planted_circle_through_function_level_imports_is_found():
    assert cycles(import_edges(PLANTED), "harness.emulation") == [
        ["harness.emulation.session", "harness.emulation.state", "harness.emulation.streams"]]


def test_planted_imports_against_the_layers_are_each_found():
    problems = "\n".join(layer_violations(import_edges(PLANTED)))
    assert "harness.emulation.placement:1 imports harness.graphs.emulated" in problems
    assert "harness.graphs.cuda:2 imports harness.emulation.session" in problems
    assert "harness.graphs.emulated:1 imports harness.emulation (emulation_active) at module" in problems
    assert "harness.graphs.emulator.recorder:2" in problems
    assert "harness.runtime.engine:1 imports harness.check.compare" in problems
    assert "harness.graphs:2" not in problems  # the public face, where it is used: allowed
