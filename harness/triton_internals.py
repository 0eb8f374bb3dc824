"""The one door to triton's private names, as torch_internals.py is to torch's.

The emulated CUDA device runs users' Triton kernels through Triton's interpreter
(emulation/triton_launches.py), which reaches names triton does not promise to keep: the
interpreter's rewriter and builder, the JIT's registry, the attributes of `JITFunction` and
`Autotuner` objects. They are resolved here and nowhere else. Importing this module never imports
triton (the CPU wheel has none): `installed()` says whether it can be, and `problems()`, which
`emulate_cuda()` asks on entry where triton is installed, probes each name; where one is missing or
misbehaves, a Triton launch on device memory is refused with one message naming the triton version
and every such piece (`unusable_error`), rather than failing later with wrong answers. The
emulation itself still enters: code that launches no Triton kernel on the device is unaffected.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from harness.internals_findings import findings


class TritonInternalsError(RuntimeError):
    """This triton lacks (or changed) a private name the harness needs."""


@dataclass(frozen=True)
class Internal:
    """One triton name: `module` (imported) then the attributes of `attribute` (dotted);
    `probe(obj)` is True when the object behaves as the harness uses it."""

    module: str
    attribute: str
    probe: Callable[[Any], bool] = callable
    optional: bool = False  # a name some releases lack, which the harness then does without

    @property
    def path(self) -> str:
        return f"{self.module}.{self.attribute}"


def _class_with(*methods: str) -> Callable[[Any], bool]:
    return lambda obj: isinstance(obj, type) and all(hasattr(obj, m) for m in methods)


def _takes(*parameters: str) -> Callable[[Any], bool]:
    return lambda fn: callable(fn) and list(inspect.signature(fn).parameters)[:len(parameters)] \
        == list(parameters)


def _probe_kernel(x_ptr, n: "tl.constexpr"):  # noqa: F821 (a string annotation, never evaluated)
    """What the JITFunction and Autotuner probes wrap: never launched."""


def _jit_function_behaves(cls: Any) -> bool:
    """A JITFunction keeps the Python function, its parameters (constexpr ones marked) and its
    pre-run hooks where the launch path reads them."""
    kernel = cls(_probe_kernel)
    try:
        return (kernel.fn is _probe_kernel and [p.name for p in kernel.params] == ["x_ptr", "n"]
                and [p.is_constexpr for p in kernel.params] == [False, True]
                and kernel.pre_run_hooks == [] and callable(kernel.run))
    finally:
        jit_function_registry().pop(f"{_probe_kernel.__module__}:{_probe_kernel.__qualname__}",
                                    None)


def _autotuner_behaves(cls: Any) -> bool:
    """An Autotuner keeps its configs, the function it launches, its argument names and its
    early pruning hook."""
    jit = resolve(NAMES["JITFunction"])(_probe_kernel)
    try:
        config = importlib.import_module("triton").Config({"n": 1})
        tuner = cls(jit, ["x_ptr", "n"], [config], [], None, None)
        return (tuner.configs == [config] and tuner.fn is jit and tuner.arg_names == ["x_ptr", "n"]
                and hasattr(tuner, "early_config_prune") and config.all_kwargs()["n"] == 1
                and hasattr(config, "pre_hook"))
    finally:
        jit_function_registry().pop(f"{_probe_kernel.__module__}:{_probe_kernel.__qualname__}",
                                    None)


# Exported name -> what it is in triton. Add rows at the end.
NAMES: dict[str, Internal] = {
    "JITFunction": Internal("triton.runtime.jit", "JITFunction", _jit_function_behaves),
    "TensorWrapper": Internal("triton.runtime.jit", "TensorWrapper", _class_with("data_ptr")),
    # triton 3.8 keeps every jitted function by name; 3.6 keeps none (nothing to restore there)
    "jit_function_registry": Internal("triton.runtime.jit", "_triton_jit_function_registry",
                                      lambda registry: isinstance(registry, dict), optional=True),
    "Autotuner": Internal("triton.runtime.autotuner", "Autotuner", _autotuner_behaves),
    # Triton's interpreter (TRITON_INTERPRET=1), run on a kernel decorated without it
    "FunctionRewriter": Internal("triton.runtime.interpreter", "FunctionRewriter",
                                 _class_with("rewrite_ast")),
    "patch_lang": Internal("triton.runtime.interpreter", "_patch_lang", _takes("fn")),
    "LangPatchScope": Internal("triton.runtime.interpreter", "_LangPatchScope",
                               _class_with("restore")),
    "implicit_cvt": Internal("triton.runtime.interpreter", "_implicit_cvt", _takes("arg")),
    "interpreter_builder": Internal("triton.runtime.interpreter", "interpreter_builder",
                                    lambda b: callable(b.set_grid_dim)
                                    and callable(b.set_grid_idx)),
    "InterpreterError": Internal("triton.runtime.interpreter", "InterpreterError",
                                 lambda c: isinstance(c, type) and issubclass(c, Exception)),
    # what triton.jit makes while TRITON_INTERPRET=1
    "InterpretedFunction": Internal("triton.runtime.interpreter", "InterpretedFunction",
                                    _class_with("run", "rewrite")),
    "AutotunerError": Internal("triton.runtime.errors", "AutotunerError",
                               lambda c: isinstance(c, type) and issubclass(c, Exception)),
}


def installed() -> bool:
    """Whether triton can be imported (the CUDA wheel ships it; the CPU wheel does not)."""
    return importlib.util.find_spec("triton") is not None


def version() -> str:
    return getattr(importlib.import_module("triton"), "__version__", "(unknown version)")


def resolve(entry: Internal) -> Any:
    """The object `entry` names in this triton (AttributeError / ImportError when absent)."""
    return functools.reduce(getattr, entry.attribute.split("."),
                            importlib.import_module(entry.module))


def problems(names: dict[str, Internal] | None = None,
             resolver: Callable[[Internal], Any] = resolve) -> list[str]:
    """What is wrong with `names` (default: all of NAMES) in this triton, one line per name."""
    return findings((NAMES if names is None else names).values(), resolver,
                    optional=lambda entry: entry.optional)


def unusable_error(found: list[str]) -> TritonInternalsError:
    """The error naming this triton's version and each of `found` (problems())."""
    return TritonInternalsError(
        f"triton {version()} lacks or changed {len(found)} name(s) the harness's emulated CUDA "
        f"device needs to run Triton kernels through Triton's interpreter: " + "; ".join(found)
        + ". Install the triton of a torch in the range pyproject.toml declares, or update "
        "harness/triton_internals.py for this release.")


def check(names: dict[str, Internal] | None = None,
          resolver: Callable[[Internal], Any] = resolve) -> None:
    """Raise one TritonInternalsError naming the triton version and every missing or misbehaving
    name, or return when all are there and behave."""
    found = problems(names, resolver)
    if found:
        raise unusable_error(found)


@functools.cache
def get(name: str) -> Any:
    """The object NAMES[name] names (triton imported at first use)."""
    return resolve(NAMES[name])


def jit_function_registry() -> dict:
    """triton's registry of jitted functions by "module:qualname" (an empty dict, not triton's,
    where this release keeps none)."""
    try:
        return resolve(NAMES["jit_function_registry"])
    except (AttributeError, ImportError):
        return {}


def language() -> Any:
    """triton.language (public; imported at first use)."""
    return importlib.import_module("triton.language")


__all__ = ["NAMES", "Internal", "TritonInternalsError", "check", "get", "installed",
           "jit_function_registry", "language", "problems", "unusable_error", "version"]
