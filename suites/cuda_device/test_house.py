"""Issue 26's house rules that are not about layers or private torch names (those are
test_import_layers.py and test_torch_internals.py): the emulated device and the graph backends
form no import circle, alone or together; no module of either shares its name with another module
of the package; and one predicate (`device_memory.is_device_memory`, with `memory_mark` for which
memory) reads the emulated device's memory mark."""

from __future__ import annotations

import ast
import collections
import pathlib

import harness
from suites.cuda_device.test_import_layers import _harness_edges, _module_names, cycles

HARNESS = pathlib.Path(harness.__file__).parent
HOME_PARTS = ("harness.emulation", "harness.graphs")
# A benchmark's module name is its `harness bench NAME` command, so those names are the CLI's.
NAMED_BY_THE_CLI = "harness.bench"
MARK_OWNER = "harness/emulation/device_memory.py"
MARK_NAMES = ("MEMORY_ATTR", "_harness_memory")


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def shared_names(modules) -> dict[str, list[str]]:
    """Module base names (the last dotted part) that a module under HOME_PARTS shares with any
    other module, benchmarks aside."""
    by_name = collections.defaultdict(list)
    for module in modules:
        if not _within(module, NAMED_BY_THE_CLI):
            by_name[module.rsplit(".", 1)[-1]].append(module)
    return {name: sorted(found) for name, found in by_name.items() if len(found) > 1
            and any(_within(m, part) for m in found for part in HOME_PARTS)}


def mark_readers(sources: dict[str, str]) -> list[str]:
    """Places outside MARK_OWNER that name the memory mark (its attribute name or constant)."""
    found = []
    for path, source in sources.items():
        if path == MARK_OWNER:
            continue
        for node in ast.walk(ast.parse(source)):
            named = (node.id if isinstance(node, ast.Name) else node.attr
                     if isinstance(node, ast.Attribute) else node.value
                     if isinstance(node, ast.Constant) and isinstance(node.value, str) else None)
            if named in MARK_NAMES:
                found.append(f"{path}:{node.lineno}: {named}")
            elif isinstance(node, ast.alias) and node.name in MARK_NAMES:
                found.append(f"{path}:{node.lineno}: imports {node.name}")
    return found


def test_no_circle_among_the_emulated_device_and_the_graph_backends():
    edges = [e for e in _harness_edges()
             if any(_within(e.source, p) for p in HOME_PARTS)
             and any(_within(e.target, p) for p in HOME_PARTS)]
    assert cycles(edges, "harness") == []


def test_no_module_of_the_device_or_the_backends_shares_a_name():
    assert shared_names(_module_names()) == {}


def test_only_device_memory_reads_the_memory_mark():
    sources = {str(path.relative_to(HARNESS.parent)): path.read_text()
               for path in sorted(HARNESS.rglob("*.py"))}
    assert mark_readers(sources) == []


# --- the checks themselves, on planted modules ------------------------------------------------

def test_a_planted_circle_across_the_device_and_a_backend_is_found():
    from suites.cuda_device.test_import_layers import import_edges

    planted = import_edges({
        "harness.emulation.placement": "from harness.graphs.emulated import EmulatedGraph\n",
        "harness.graphs.emulated": "def f():\n    from harness.emulation.placement import x\n"})
    assert cycles(planted, "harness") == [["harness.emulation.placement", "harness.graphs.emulated"]]


def test_a_planted_second_session_module_is_found():
    modules = ["harness.emulation.session", "harness.graphs.emulator.session",
               "harness.bench.capture", "harness.faults.capture", "harness.bench.emulator",
               "harness.graphs.emulator"]
    assert shared_names(modules) == {
        "session": ["harness.emulation.session", "harness.graphs.emulator.session"]}


def test_a_planted_second_reader_of_the_mark_is_found():
    planted = {
        MARK_OWNER: "MEMORY_ATTR = '_harness_memory'\n",
        "harness/emulation/kernels.py": "from harness.emulation.device_memory import MEMORY_ATTR\n",
        "harness/graphs/cuda.py": "def f(s):\n    return getattr(s, '_harness_memory', None)\n",
        "harness/emulation/threads.py": "from harness.emulation.device_memory import is_device_memory\n"}
    assert mark_readers(planted) == ["harness/emulation/kernels.py:1: imports MEMORY_ATTR",
                                     "harness/graphs/cuda.py:2: _harness_memory"]
