"""`--plant-fault NAME`: one fault of the zoo planted for the whole session (spawned ranks and xdist
workers included), its firings counted and reported (`--fault-report`)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

_planted = pytest.StashKey["tuple[contextlib.ExitStack, object]"]()
_worker_firings = pytest.StashKey[int]()


def check_fault_option(name: str | None, backend_option: str, engine_compile: str | None = None) -> None:
    """Refuse an unknown fault, one this build cannot plant, or one that cannot apply on the engine
    path of the session (`--engine-compile`), before any test runs."""
    if name is None:
        return
    from harness.faults import FAULTS
    from harness.graphs import resolve_backend

    fault = FAULTS.get(name)
    if fault is None:
        raise pytest.UsageError(f"--plant-fault {name}: no such fault; known faults: "
                                f"{', '.join(sorted(FAULTS))}")
    backend = resolve_backend(backend_option)
    reason = fault.unplantable(backend)
    if reason:
        raise pytest.UsageError(f"--plant-fault {name}: not plantable on this build for the "
                                f"{backend} backend: {reason}")
    reason = fault.inapplicable(engine_compile)
    if reason:
        raise pytest.UsageError(f"--plant-fault {name} --engine-compile {engine_compile}: not "
                                f"applicable on the compiled path: {reason}")


def plant(config: pytest.Config) -> None:
    """Before collection: test modules imported afterwards bind the planted functions."""
    name = config.getoption("plant_fault")
    if name is None:
        return
    import tempfile

    from harness.faults import FIRINGS_FILE_VARIABLE, PLANTED_FAULT_VARIABLE, inherited_firings, inject
    from harness.graphs import resolve_backend

    stack = contextlib.ExitStack()
    handle = stack.enter_context(inject(name, resolve_backend(config.getoption("graph_backend"))))
    # Spawned rank processes plant it again through harness.faults.inherited_fault.
    firings = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fault-firings-"))) / "fired"
    stack.enter_context(_environment({PLANTED_FAULT_VARIABLE: name, FIRINGS_FILE_VARIABLE: str(firings)}))
    stack.callback(lambda: setattr(handle, "fired", handle.fired + inherited_firings(firings)))
    config.stash[_planted] = (stack, handle)


def planted_name(config: pytest.Config) -> str | None:
    planted = config.stash.get(_planted, None)
    return planted[1].name if planted else None


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def finish(session: pytest.Session, exitstatus: int) -> None:
    planted = session.config.stash.get(_planted, None)
    if planted is None:
        return
    stack, handle = planted
    stack.close()
    handle.fired += session.config.stash.get(_worker_firings, 0)
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller adds this to its count
        workeroutput["harness_fault_fired"] = handle.fired
    path = session.config.getoption("fault_report")
    if path is not None and workeroutput is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"fault": handle.name, "fired": handle.fired,
                                    "exitstatus": int(exitstatus)}) + "\n")


def add_worker_firings(node) -> None:
    """xdist's controller, as a worker ends: its firings of the planted fault join the count."""
    fired = getattr(node, "workeroutput", {}).get("harness_fault_fired", 0)
    config = node.config
    config.stash[_worker_firings] = config.stash.get(_worker_firings, 0) + fired


def summary_line(config: pytest.Config) -> str | None:
    planted = config.stash.get(_planted, None)
    if planted is None:
        return None
    return f"planted fault {planted[1].name}: fired {planted[1].fired} times"
