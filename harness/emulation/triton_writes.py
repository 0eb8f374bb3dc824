"""Which of a Triton kernel's parameters it may write through, read off its source.

A launch on the emulated device is one device op on the current stream (triton_launches.py): the
stream tracking and a capture need to know, before the kernel runs (a capture never runs it), which
tensor arguments it writes and which it only reads, as the schema of an aten op says. A Triton
kernel writes memory only through `tl.store` and the `tl.atomic_*` functions (and their method
forms on tensor and block descriptors), so the parameters it writes are those whose value flows
into the pointer of one of those calls: through assignments (`p = out_ptr + offs`, `p += stride`),
loop variables, `tl.make_block_ptr(base=...)`, `tl.advance`, and the arguments of the jitted helper
functions it calls, whose own parameters are analysed the same way.

The analysis errs towards writes, never towards reads: a value loaded from memory (`tl.load`) is
data, not one of the pointers it was loaded through; any other expression carries every parameter
it mentions; a call to a name that resolves to nothing known carries its arguments into the
written set. A kernel whose source cannot be read (made with `exec`) writes every pointer it is
given (`None` below). So a write may be reported that the kernel does not make on that launch (a
store under a condition that is false), never a read-only argument seen as written by mistake for
a kernel that only loads through it.
"""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
import textwrap
import types
from typing import Any

from harness import triton_internals

# triton.language's functions that write memory through their first argument (`pointer`).
STORES = frozenset({"store", "atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min",
                    "atomic_or", "atomic_xchg", "atomic_xor", "atomic_fadd"})
_LOADS = frozenset({"load"})
_UNRESOLVED = object()


def written_parameters(fn: Any) -> frozenset[str] | None:
    """The names of the kernel function `fn`'s parameters that it may write through (the
    JITFunction's `.fn`); None where its source cannot be read (treat every pointer as written)."""
    if fn in _IN_PROGRESS:  # Triton has no recursion; a cycle here adds no write
        return frozenset()
    _IN_PROGRESS.add(fn)
    try:
        return _written(fn)
    finally:
        _IN_PROGRESS.discard(fn)


_IN_PROGRESS: set = set()


@functools.lru_cache(maxsize=None)
def _written(fn: Any) -> frozenset[str] | None:
    return _Analysis(fn).written()


class _Analysis:
    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.closure = inspect.getclosurevars(fn).nonlocals if isinstance(
            fn, types.FunctionType) else {}
        self.globals = getattr(fn, "__globals__", {})

    def written(self) -> frozenset[str] | None:
        try:
            source = textwrap.dedent(inspect.getsource(self.fn))
            tree = ast.parse(source)
        except (OSError, TypeError, SyntaxError):
            return None
        definition = next((node for node in ast.walk(tree)
                           if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
        if definition is None:
            return None
        arguments = definition.args
        self.parameters = [a.arg for a in (*arguments.posonlyargs, *arguments.args,
                                           *arguments.kwonlyargs)]
        self.deps: dict[str, frozenset[str]] = {p: frozenset({p}) for p in self.parameters}
        self._flow(definition)
        written: set[str] = set()
        for node in ast.walk(definition):
            if isinstance(node, ast.Call):
                written |= self._writes_of(node)
        return frozenset(written) & frozenset(self.parameters)

    # --- where each name's value comes from -------------------------------------------------

    def _flow(self, definition: ast.AST) -> None:
        """Every assignment's target carries the parameters its value carries; to a fixpoint, as
        a loop may carry a value back to an earlier line."""
        changed = True
        while changed:
            changed = False
            for node in ast.walk(definition):
                for targets, value in _assignments(node):
                    carried = self._carried(value)
                    if isinstance(node, ast.AugAssign):
                        carried |= self._carried(node.target)
                    for name in targets:
                        before = self.deps.get(name, frozenset())
                        if not carried <= before:
                            self.deps[name] = before | carried
                            changed = True

    def _carried(self, node: ast.AST) -> frozenset[str]:
        """The parameters an expression's value may be computed from (a loaded value is data)."""
        if isinstance(node, ast.Name):
            return self.deps.get(node.id, frozenset())
        if isinstance(node, ast.Call) and self._function_name(node) in _LOADS:
            return frozenset()
        out: frozenset[str] = frozenset()
        for child in ast.iter_child_nodes(node):
            out |= self._carried(child)
        return out

    # --- the calls that write ----------------------------------------------------------------

    def _writes_of(self, call: ast.Call) -> frozenset[str]:
        target = self._resolve(call.func)
        name = self._function_name(call)
        if name in STORES and self._is_language(call.func):
            pointer = _argument(call, 0, "pointer")
            return self._carried(pointer) if pointer is not None else frozenset()
        if name in STORES and isinstance(call.func, ast.Attribute):
            # a method of a value (`desc.store(offsets, value)`): it writes what it describes
            return self._carried(call.func.value)
        if isinstance(target, _jitted()):
            return self._helper_writes(call, target.fn)
        if target is _UNRESOLVED and isinstance(call.func, ast.Name):
            # a name this analysis cannot follow: whatever it is given may be written
            out = frozenset()
            for argument in (*call.args, *(k.value for k in call.keywords)):
                out |= self._carried(argument)
            return out
        return frozenset()

    def _helper_writes(self, call: ast.Call, helper: Any) -> frozenset[str]:
        written = written_parameters(helper)
        try:
            parameters = list(inspect.signature(helper).parameters)
        except (TypeError, ValueError):
            parameters = []
        out: frozenset[str] = frozenset()
        for index, argument in enumerate(call.args):
            if isinstance(argument, ast.Starred) or written is None or (
                    index < len(parameters) and parameters[index] in written):
                out |= self._carried(argument)
        for keyword in call.keywords:
            if keyword.arg is None or written is None or keyword.arg in written:
                out |= self._carried(keyword.value)
        return out

    # --- names ---------------------------------------------------------------------------------

    def _function_name(self, call: ast.Call) -> str | None:
        func = call.func
        if isinstance(func, ast.Attribute):
            return func.attr
        if isinstance(func, ast.Name):
            target = self._resolve(func)
            return getattr(target, "__name__", func.id) if self._is_language_object(target) \
                else func.id
        return None

    def _is_language(self, func: ast.AST) -> bool:
        """Whether `func` is one of triton.language's functions (`tl.store`, `store` imported
        from it), not a method of a value."""
        if isinstance(func, ast.Attribute):
            return isinstance(self._resolve(func.value), types.ModuleType)
        return self._is_language_object(self._resolve(func))

    @staticmethod
    def _is_language_object(obj: Any) -> bool:
        module = getattr(obj, "__module__", None) or ""
        return module.startswith("triton.language")

    def _resolve(self, node: ast.AST) -> Any:
        """The object a name or a dotted name refers to in the kernel's scope, or _UNRESOLVED."""
        if isinstance(node, ast.Name):
            if node.id in self.deps and node.id not in self.closure and node.id not in self.globals:
                return _UNRESOLVED  # a local variable or a parameter
            for scope in (self.closure, self.globals, vars(builtins)):
                if node.id in scope:
                    return scope[node.id]
            return _UNRESOLVED
        if isinstance(node, ast.Attribute):
            owner = self._resolve(node.value)
            if owner is _UNRESOLVED:
                return _UNRESOLVED
            return getattr(owner, node.attr, _UNRESOLVED)
        return _UNRESOLVED


def _jitted() -> tuple[type, ...]:
    """What `@triton.jit` makes: a JITFunction (an InterpretedFunction under TRITON_INTERPRET=1)."""
    return (triton_internals.get("JITFunction"), triton_internals.get("InterpretedFunction"))


def _assignments(node: ast.AST):
    """(target names, value) for each binding `node` makes."""
    if isinstance(node, ast.Assign):
        names = [n for target in node.targets for n in _names(target)]
        yield names, node.value
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
        yield _names(node.target), node.value
    elif isinstance(node, (ast.For, ast.AsyncFor)):
        yield _names(node.target), node.iter
    elif isinstance(node, ast.NamedExpr):
        yield _names(node.target), node.value
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        for item in node.items:
            if item.optional_vars is not None:
                yield _names(item.optional_vars), item.context_expr
    elif isinstance(node, ast.comprehension):
        yield _names(node.target), node.iter


def _names(target: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _argument(call: ast.Call, index: int, keyword: str) -> ast.AST | None:
    for k in call.keywords:
        if k.arg == keyword:
            return k.value
    if len(call.args) > index and not isinstance(call.args[index], ast.Starred):
        return call.args[index]
    return None


__all__ = ["STORES", "written_parameters"]
