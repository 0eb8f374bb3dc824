"""Running a `@triton.jit` kernel through Triton's interpreter, on memory the host can address.

Triton's interpreter (TRITON_INTERPRET=1 when a kernel is decorated) rewrites the kernel's Python
so that `tl.*` runs on numpy, and runs it once per program of the grid, reading and writing through
the arguments' data pointers. A kernel decorated without it is a `JITFunction`, which compiles for
a GPU; this module interprets such a kernel as the interpreter would have (and one decorated with
it, an `InterpretedFunction`, the same way), with three differences of the harness's:

- the emulated device's memory is the host's, so the arguments' own memory is read and written
  (the interpreter's launcher copies each storage to a host copy and back, which would copy a
  whole KV cache at every launch and write back arguments the kernel only reads);
- the rewritten kernel runs in a copy of its module's globals (refreshed at each launch), so the
  interpreter's own names, which it adds to the globals it runs in, never land in the user's module;
- jitted helpers the kernel calls are `JITFunction`s too: while a kernel is interpreted,
  `JITFunction.__call__` (which otherwise refuses a call outside a kernel) interprets them
  (`call_helper`, installed by triton_launches.py for the emulation's duration).

Every private name of triton is reached through harness/triton_internals.py.
"""

from __future__ import annotations

import inspect
import threading
import types
from typing import Any

from harness import triton_internals

_RUNNING = threading.local()


class _Rewritten:
    """A kernel function rewritten for the interpreter, with the globals it runs in."""

    def __init__(self, fn: Any) -> None:
        self.globals = dict(fn.__globals__)
        copy = types.FunctionType(fn.__code__, self.globals, fn.__name__, fn.__defaults__,
                                  fn.__closure__)
        copy.__qualname__, copy.__module__ = fn.__qualname__, fn.__module__
        registry = triton_internals.jit_function_registry()
        key = f"{fn.__module__}:{fn.__qualname__}"
        kept = registry.get(key)
        try:
            # The rewriter makes a JITFunction of what it rewrites (to find the file and line),
            # which takes the kernel's place in triton's registry of jitted functions.
            self.function = triton_internals.get("FunctionRewriter")(copy).rewrite_ast()
        finally:
            if kept is None:
                registry.pop(key, None)
            else:
                registry[key] = kept
        self.source_globals = fn.__globals__

    def refreshed(self) -> Any:
        """The rewritten function, its globals brought up to date with the module's."""
        self.globals.update(self.source_globals)
        return self.function


_REWRITTEN: dict[Any, _Rewritten] = {}
_LOCK = threading.Lock()


def _rewritten(fn: Any) -> Any:
    with _LOCK:
        entry = _REWRITTEN.get(fn)
        if entry is None:
            entry = _REWRITTEN[fn] = _Rewritten(fn)
        return entry.refreshed()


def constexpr_names(kernel: Any) -> frozenset[str]:
    """The kernel's `tl.constexpr` parameters (passed to the kernel as they are, not as tensors):
    a JITFunction marks them; an InterpretedFunction (TRITON_INTERPRET=1) has only annotations."""
    params = getattr(kernel, "params", None)
    if params is not None:
        return frozenset(p.name for p in params if p.is_constexpr)
    return frozenset(name for name, p in inspect.signature(kernel.fn).parameters.items()
                     if "constexpr" in str(p.annotation))


def _scalar_index(tensor: Any) -> int:
    """A scalar's value where Python wants an int (`range(0, K, BLOCK)` over a scalar argument).
    The interpreter holds every scalar as a one-element array; triton 3.6 reads it with
    `int(data)`, which numpy 2.4 refuses for an array of one dimension. Later tritons squeeze
    first, as this does."""
    return int(tensor.handle.data.squeeze())


def _boolean(mask: Any) -> Any:
    """`mask` with boolean data. An int1 mask and-ed with a scalar comparison holds int32 data in
    triton 3.9's interpreter, whose C++ load and store then refuse it ("mask has unsupported
    dtype"); compiled code takes it, as do earlier interpreters."""
    if mask.data.dtype == bool:
        return mask
    return type(mask)(mask.data.astype(bool), mask.dtype)


def _language_patched(fn: Any) -> Any:
    """triton.language patched for interpreting `fn`, as the interpreter patches it, with a
    scalar's `__index__` that every numpy takes and masks every interpreter loads with; the
    returned scope restores all of it."""
    import triton.language as tl

    scope = triton_internals.get("patch_lang")(fn)
    scope.set_attr(tl.tensor, "__index__", _scalar_index)
    builder = triton_internals.get("interpreter_builder")
    load, store = builder.create_masked_load, builder.create_masked_store
    scope.set_attr(builder, "create_masked_load",
                   lambda ptrs, mask, *rest: load(ptrs, _boolean(mask), *rest))
    scope.set_attr(builder, "create_masked_store",
                   lambda ptrs, value, mask, *rest: store(ptrs, value, _boolean(mask), *rest))
    return scope


def run_grid(kernel: Any, grid: tuple[int, int, int], arguments: dict[str, Any]) -> None:
    """Run `kernel` (a JITFunction or an InterpretedFunction) over `grid` with `arguments` by
    parameter name (tensors, Python scalars, constexpr values), as one launch: every program in
    turn, in grid order."""
    fn = kernel.fn
    constexprs = constexpr_names(kernel)
    convert = triton_internals.get("implicit_cvt")
    builder = triton_internals.get("interpreter_builder")
    function = _rewritten(fn)
    scope = _language_patched(fn)
    depth = getattr(_RUNNING, "depth", 0)
    _RUNNING.depth = depth + 1
    try:
        values = {name: value if name in constexprs else convert(value)
                  for name, value in arguments.items()}
        builder.set_grid_dim(*grid)
        try:
            for x in range(grid[0]):
                for y in range(grid[1]):
                    for z in range(grid[2]):
                        builder.set_grid_idx(x, y, z)
                        function(**values)
        except Exception as error:
            # as Triton's interpreter reports a failure inside a kernel
            raise triton_internals.get("InterpreterError")(repr(error)) from error
    finally:
        _RUNNING.depth = depth
        scope.restore()


def interpreting() -> bool:
    """Whether a kernel is being interpreted on this thread."""
    return getattr(_RUNNING, "depth", 0) > 0


def call_helper(helper: Any, args: tuple, kwargs: dict) -> Any:
    """A jitted helper called from an interpreted kernel: its rewritten function, with
    triton.language patched for the helper's module too."""
    scope = _language_patched(helper.fn)
    try:
        return _rewritten(helper.fn)(*args, **kwargs)
    finally:
        scope.restore()


__all__ = ["call_helper", "constexpr_names", "interpreting", "run_grid"]
