"""pytest sessions of their own, each in a fresh process, without paying for torch's import in each.

A fault is planted for a whole pytest session (the plugin's `--plant-fault`, before collection), so
every planted run needs a process no other run has touched. Starting `python -m pytest` costs about
7 s of CPU on the 2-core machine before the test runs, most of it importing torch, its compiler and
distributed packages, transformers, Hypothesis and pytest. Here each session is a process forked
from a server (multiprocessing's forkserver) that imported those third-party modules once and
nothing of the harness: the harness modules are imported by the session itself, in the order a
`python -m pytest` process imports them, so a planted fault binds exactly as it does there.
Measured: about 1.7 s of CPU per session instead of 7.5 s.

Where the platform has no forkserver (Windows), each session is a `python -m pytest` subprocess;
`session_kind()` says which, and `harness faults` prints it.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from harness.testdb.child_pytest import plugin_arguments

# Third-party only: a harness module imported here would be bound before a fault is planted.
PRELOAD = ("torch", "torch._dynamo", "torch.distributed", "numpy", "yaml", "hypothesis", "pytest",
           "_pytest.python", "transformers")


@dataclass(frozen=True)
class SessionResult:
    returncode: int
    output: str
    seconds: float
    cpu_seconds: float | None = None  # the session's and its children's; None for a subprocess


def _environment(root: Path) -> dict[str, str]:
    """The session's environment: this one's without pytest's own variables (a session started
    from inside a test must not inherit its test's), the checkout on PYTHONPATH, one OpenMP thread
    unless told otherwise (sessions run side by side)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _forked_session(args: list[str], root: str, env: dict[str, str], output: str) -> None:
    """The forked process: becomes what `python -m pytest ARGS` in `root` with `env` would be,
    its output to the file `output`, and exits with pytest's exit code."""
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    code = 3  # pytest's "internal error", should pytest itself fail to start
    try:
        os.chdir(root)
        os.environ.clear()
        os.environ.update(env)
        sys.path[:0] = [p for p in env["PYTHONPATH"].split(os.pathsep) if p]
        sys.argv = [sys.executable, "-m", "pytest", *args]
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))  # torch read the variable in the server
        import pytest

        code = int(pytest.main(args))
    except BaseException as error:  # reported in the output, as a crashed pytest process would be
        os.write(fd, f"\n[harness faults] the session failed: {type(error).__name__}: {error}\n".encode())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # CPU time is what a shared machine cannot distort: kept beside the output.
        import resource

        used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        Path(output + ".cpu").write_text(str(sum(u.ru_utime + u.ru_stime for u in used)))
        os._exit(code)


def session_kind() -> str:
    """How `run_session` starts a session on this platform."""
    return (FORKED if "forkserver" in multiprocessing.get_all_start_methods() else SUBPROCESS)


FORKED = "forked from a preloaded server"
SUBPROCESS = "python -m pytest subprocesses"


def run_session(args: Sequence[str], *, root: Path) -> SessionResult:
    """`python -m pytest ARGS` in `root`, in a process of its own (the module's docstring)."""
    env = _environment(root)
    args = [*plugin_arguments(env), *args]
    started = time.monotonic()
    if session_kind() == SUBPROCESS:
        proc = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=root, env=env,
                              capture_output=True, text=True)
        return SessionResult(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started)
    # multiprocessing keeps one forkserver per process, started at the first Process; the preload
    # list is read then (a module that fails to import there is skipped).
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    with tempfile.NamedTemporaryFile(prefix="pytest-session-", suffix=".log") as output:
        process = context.Process(target=_forked_session, args=(list(args), str(root), env, output.name))
        process.start()
        process.join()
        text = Path(output.name).read_text(errors="replace")
        cpu_file = Path(output.name + ".cpu")
        cpu = float(cpu_file.read_text()) if cpu_file.is_file() else None
        cpu_file.unlink(missing_ok=True)
    code = process.exitcode
    if code is not None and code < 0:  # killed by a signal, as a subprocess's returncode says it
        text += f"\n[harness faults] the session was killed by signal {-code}\n"
    return SessionResult(code if code is not None else 3, text, time.monotonic() - started, cpu)
