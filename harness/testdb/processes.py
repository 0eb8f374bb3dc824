"""The pytest processes of `harness run`: each in a process group of its own (xdist workers
included), killed as one group at its timeout, and stopped as one group when the run is stopped.

A SIGINT or SIGTERM to `harness run` is passed on as SIGINT to the running group, so pytest stops
the way Ctrl-C stops it and writes the JUnit XML of the tests done; a group still there after
`STOP_GRACE_S` is killed. Nothing of a run outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

STOP_GRACE_S = 30.0
_LEFTOVER_WAIT_S = 10.0
_INHERITED_PYTEST_VARS = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID",
                          "PYTEST_CURRENT_TEST")


class StopRequest:
    """The signal that stopped a run (None while it goes on) and the process group running now."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._group: int | None = None
        self._killer: threading.Timer | None = None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def stop(self, signum: int, frame=None) -> None:
        first = self.signum is None
        self.signum = self.signum or signum
        group = self._group
        if group is None:
            return
        if not first:  # a second Ctrl-C: no more patience
            _signal_group(group, signal.SIGKILL)
            return
        _signal_group(group, signal.SIGINT)
        self._killer = threading.Timer(STOP_GRACE_S, _signal_group, (group, signal.SIGKILL))
        self._killer.daemon = True
        self._killer.start()

    def running(self, group: int | None) -> None:
        if group is None and self._killer is not None:
            self._killer.cancel()
            self._killer = None
        self._group = group


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[StopRequest]:
    """SIGINT and SIGTERM stop the run instead of killing this process (main thread only)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {signum: signal.signal(signum, request.stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield request
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def execute(cmd: list[str], *, cwd: Path, timeout: float | None, stop: StopRequest | None = None) -> int | None:
    """Run `cmd` with inherited stdout in a process group of its own; its exit code, or None if it
    ran past `timeout` seconds. `stop` learns the group, so a signal to this process reaches it."""
    env = {k: v for k, v in os.environ.items() if k not in _INHERITED_PYTEST_VARS}
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, start_new_session=True)
    if stop is not None:
        stop.running(proc.pid)
        if stop.signum is not None:  # stopped between two runs' start-up
            stop.stop(stop.signum)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
        return None
    except BaseException:
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        if stop is not None:
            stop.running(None)
        end_group(proc.pid)


def end_group(group: int) -> None:
    """Kill what is left of process group `group` (xdist workers of a controller that is gone) and
    wait until none of it runs."""
    if not group_members(group):
        return
    _signal_group(group, signal.SIGKILL)
    deadline = time.monotonic() + _LEFTOVER_WAIT_S
    while group_members(group) and time.monotonic() < deadline:
        time.sleep(0.02)  # killed processes need the kernel, not us: a short wait between looks


def group_members(group: int) -> list[int]:
    """Pids of the live (not zombie) processes in process group `group`, from /proc."""
    members = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command: state, ppid, pgrp, ...
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] not in ("Z", "X") and int(fields[2]) == group:
            members.append(int(entry.name))
    return members


def _signal_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)
