"""The fault zoo's registry: one real class of capture bug per entry, a way to plant it in the
reference runtime, and the test expected to catch it."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterator, Mapping


class FaultHandle:
    """What `inject` yields: `fired` counts how many times the planted code ran."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.fired = 0

    def fire(self) -> None:
        self.fired += 1


class NotPlantableError(RuntimeError):
    """A fault that this build (or this backend) cannot plant; the message says why."""


def always_plantable(backend: str) -> str | None:
    return None


@dataclass(frozen=True)
class Fault:
    """One planted bug.

    - `bug_class`: the class of bug, in one line; `link`: the public report it comes from.
    - `detector`: the pytest node id expected to catch it (fail with the fault planted, pass without).
    - `expected`: a regular expression the detector's failure output must match: the diagnosis that
      names the cause (a divergence report, moved tensors, a CaptureError, a clear message).
    - `plant(handle)`: a context manager that plants the fault and calls `handle.fire()` each time
      the planted code runs.
    - `unplantable(backend)`: why the fault cannot be planted on this build for that backend
      ("emulated" or "cuda"), or None.
    - `not_on_compiled_path`: why the fault cannot apply with the engines on the compiled path
      (EngineConfig.compile="inductor", `harness faults --engine-compile inductor`), or None: it
      is planted into code that path never runs. Such a fault is reported "not applicable" there,
      not run, and not counted as missed.
    """

    name: str
    bug_class: str
    link: str
    detector: str
    expected: str
    plant: Callable[[FaultHandle], ContextManager[None]]
    unplantable: Callable[[str], str | None] = always_plantable
    not_on_compiled_path: str | None = None

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", self.name):
            raise ValueError(f"fault name {self.name!r} must be lowercase words joined by '-'")
        if "::" not in self.detector:
            raise ValueError(f"fault {self.name}: detector {self.detector!r} is not a pytest node id")
        re.compile(self.expected)
        if self.not_on_compiled_path is not None and not self.not_on_compiled_path.strip():
            raise ValueError(f"fault {self.name}: not_on_compiled_path must say why, got "
                             f"{self.not_on_compiled_path!r}")

    def inapplicable(self, engine_compile: str | None) -> str | None:
        """Why the fault cannot apply with the engines compiled as `engine_compile` (EngineConfig's
        compile: None or "none" is the eager ops, "inductor" the compiled path), or None."""
        return self.not_on_compiled_path if engine_compile == "inductor" else None


def registry(*families: tuple[Fault, ...]) -> Mapping[str, Fault]:
    faults: dict[str, Fault] = {}
    for family in families:
        for fault in family:
            if fault.name in faults:
                raise ValueError(f"fault {fault.name!r} is registered twice")
            faults[fault.name] = fault
    return faults


def get_fault(faults: Mapping[str, Fault], name: str) -> Fault:
    fault = faults.get(name)
    if fault is None:
        raise KeyError(f"no fault named {name!r}; known faults: {', '.join(sorted(faults))}")
    return fault


@contextlib.contextmanager
def inject_fault(fault: Fault, backend: str) -> Iterator[FaultHandle]:
    reason = fault.unplantable(backend)
    if reason:
        raise NotPlantableError(f"fault {fault.name!r} is not plantable on this build for the "
                                f"{backend} backend: {reason}")
    handle = FaultHandle(fault.name)
    with fault.plant(handle):
        yield handle
