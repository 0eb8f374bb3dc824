"""`harness repro FILE`: replay a reproduction file standalone and give the verdict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

from harness.repro.record import ReproRecord
from harness.repro.scenario import ReplayResult, run_scenario
from harness.testdb.child_pytest import plugin_arguments


def replay(record: ReproRecord, *, without_fault: bool = False, root: Path | None = None,
           engine_defaults: Mapping[str, Any] = {}, extra_options: tuple[str, ...] = ()) -> ReplayResult:
    """A scenario runs in this process (the fault planted for the duration, unless `without_fault`;
    `engine_defaults` fill the engine fields it leaves unset); any other test re-runs alone under
    pytest with its recorded options and `extra_options` (`--emulate-cuda`) not recorded already."""
    fault = None if without_fault else record.fault
    if record.scenario is not None:
        if fault is None:
            result = run_scenario(record.scenario, defaults=engine_defaults)
        else:
            from harness.faults import inject

            with inject(fault, record.scenario.backend) as handle:
                result = run_scenario(record.scenario, defaults=engine_defaults)
            result = type(result)(result.ok, f"{result.report}\nfault {fault} planted, fired {handle.fired} times")
        return result
    if root is None:
        recorded = Path(record.root) if record.root else None
        # A file carried to another checkout re-runs against that checkout's suites.
        root = recorded if recorded is not None and recorded.is_dir() else _project_root()
    return _rerun_test(record, fault, root, extra_options)


def _project_root() -> Path:
    from harness.testdb import project_root  # the project the test belongs to: the user's

    return project_root()


def _rerun_test(record: ReproRecord, fault: str | None, root: Path,
                extra_options: tuple[str, ...] = ()) -> ReplayResult:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    cmd = [sys.executable, "-m", "pytest", *plugin_arguments(env), record.node_id, "-p", "no:xdist",
           "-q", *record.pytest_options,
           *(o for o in extra_options if o not in record.pytest_options)]
    if fault is not None:
        cmd += ["--plant-fault", fault]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    output = (proc.stdout + proc.stderr)[-6000:]
    return ReplayResult(proc.returncode == 0, f"$ {' '.join(cmd[1:])}\n{output}")
