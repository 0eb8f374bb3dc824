"""The one door to torch's private names (harness/torch_internals.py): every private name is
reached there and nowhere else in harness/, and a torch that lacks one refuses emulate_cuda() with
one message naming the torch version and every missing piece."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

import harness
from harness import torch_internals
from harness.torch_internals import NAMES, Internal, TorchInternalsError

HARNESS = pathlib.Path(harness.__file__).parent
DOOR = HARNESS / "torch_internals.py"
# Private attributes of torch's objects (not modules) that the harness reads: through the door too.
PRIVATE_OBJECT_ATTRIBUTES = {"_cdata"}


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_torch_names(source: str) -> list[tuple[int, str]]:
    """(line, dotted name) for every private torch name `source` reaches: imports of private torch
    modules or names, attribute chains on a name bound to torch (or anything imported from it)
    with a private part, and the private object attributes above. `torch.ops.<namespace>` names
    operators, not Python names, and is not private."""
    tree = ast.parse(source)
    bound: dict[str, str] = {}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    bound[alias.asname or "torch"] = alias.name if alias.asname else "torch"
                    if any(map(_private, alias.name.split("."))):
                        found.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                bound[alias.asname or alias.name] = full
                if any(map(_private, full.split("."))):
                    found.append((node.lineno, full))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        if node.attr in PRIVATE_OBJECT_ATTRIBUTES:
            found.append((node.lineno, f"<object>.{node.attr}"))
            continue
        chain, root = [], node
        while isinstance(root, ast.Attribute):
            chain.append(root.attr)
            root = root.value
        if isinstance(root, ast.Name) and root.id in bound:
            full = bound[root.id].split(".") + chain[::-1]
            if full[:2] != ["torch", "ops"] and _private(node.attr):
                found.append((node.lineno, ".".join(full)))
    return found


def test_the_walk_finds_each_kind_of_private_name():
    planted = (
        "import torch\nimport torch._dynamo\nfrom torch.utils._pytree import tree_flatten\n"
        "from torch import _C as C\nimport torch.nn.functional as F\n"
        "torch._C._len_torch_function_stack()\nF._canonical_mask\nx.untyped_storage()._cdata\n"
        "torch.ops._c10d_functional.wait_tensor\ntorch.cuda.is_available()\ntorch.__version__\n")
    names = {name for _, name in private_torch_names(planted)}
    assert {"torch._dynamo", "torch.utils._pytree.tree_flatten", "torch._C",
            "torch._C._len_torch_function_stack", "torch.nn.functional._canonical_mask",
            "<object>._cdata"} <= names
    assert not any("ops" in n or "is_available" in n or "__version__" in n for n in names)


def test_no_module_but_the_door_reaches_a_private_torch_name():
    reached = [f"{path.relative_to(HARNESS.parent)}:{line}: {name}"
               for path in sorted(HARNESS.rglob("*.py")) if path != DOOR
               for line, name in private_torch_names(path.read_text())]
    assert not reached, ("private torch names outside harness/torch_internals.py (add them to "
                         "its NAMES and import them from there):\n" + "\n".join(reached))


def test_every_name_exists_and_behaves_in_this_torch():
    assert torch_internals.problems() == []


def _without(paths: set[str]):
    def resolver(entry: Internal):
        if entry.path in paths:
            raise AttributeError(f"module has no attribute {entry.attribute.split('.')[-1]!r}")
        return torch_internals.resolve(entry)
    return resolver


def test_missing_names_give_one_message_naming_the_version_and_each_piece():
    gone = {"torch._C._len_torch_function_stack", "torch.utils._pytree.tree_flatten"}
    with pytest.raises(TorchInternalsError) as caught:
        torch_internals.check(resolver=_without(gone))
    message = str(caught.value)
    assert message.startswith(f"torch {torch.__version__} lacks or changed 2 private name(s)")
    for path in gone:
        assert f"{path} (missing:" in message
    assert "torch.utils._pytree.tree_map_only" not in message


def test_a_name_that_misbehaves_is_named_with_its_probe():
    changed = {"stack": Internal("torch._C", "_len_torch_function_stack", lambda f: f() == -1)}
    problems = torch_internals.problems(changed)
    assert len(problems) == 1 and problems[0].startswith(
        "torch._C._len_torch_function_stack (does not behave:")
    failing = {"flatten": Internal("torch.utils._pytree", "tree_flatten",
                                   lambda f: f(object(), 1, 2))}
    assert "TypeError" in torch_internals.problems(failing)[0]


def test_a_lazy_module_is_found_not_imported():
    assert torch_internals.problems({"m": Internal("torch._no_such_module", "", lambda _: False,
                                                   lazy=True)})
    assert NAMES["dynamo"].lazy and torch_internals.problems({"d": NAMES["dynamo"]}) == []


def test_entering_the_emulation_refuses_a_torch_that_lacks_a_name(outside_emulation, monkeypatch):
    # The public seam: the NAMES table the check reads; a planted entry for a name torch lacks.
    monkeypatch.setitem(NAMES, "planted", Internal("torch._C", "_no_such_function"))
    with pytest.raises(TorchInternalsError, match=r"torch\._C\._no_such_function \(missing:"):
        with harness.emulate_cuda(device="cpu"):
            pass
    assert not torch.cuda.is_available() or torch.cuda.device_count() > 0
    from harness.emulation import emulation_active

    assert emulation_active() is None


def test_an_absent_name_is_bound_to_a_stand_in_that_raises_when_used():
    stand_in = torch_internals.bind(Internal("torch._C", "_no_such_function"))
    with pytest.raises(TorchInternalsError, match=r"has no torch\._C\._no_such_function"):
        stand_in()
    # a base class the harness subclasses at import: still a class, which refuses to be made
    base = torch_internals.bind(Internal("torch._C", "TorchDispatchMode"))
    assert isinstance(base, type)
    with pytest.raises(TorchInternalsError, match="has no torch._C.TorchDispatchMode"):
        base()
