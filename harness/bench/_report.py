"""Where a benchmark result came from (date, commit, machine, threads) and how it is appended to
the file `--output` names (the project's own record is docs/benchmarks.md)."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

import torch

_HEADER = "# Benchmarks\n\nAppended by `harness bench NAME --output FILE`; newest last.\n"


def git_commit() -> str:
    """Short hash of HEAD, with "+dirty" for local changes; "uncommitted" where there is none."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        return "uncommitted"
    try:
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        dirty = False
    return f"{commit}+dirty" if dirty else commit


def machine_line(threads: int) -> str:
    """The machine a result was timed on; `threads` is the torch thread count it was timed with."""
    return (f"machine: {platform.platform()}, {os.cpu_count()} cores "
            f"(timed with {threads} torch threads), python {platform.python_version()}, "
            f"torch {torch.__version__}")


def append_section(path: str | os.PathLike, title: str, body: str, *, threads: int) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    section = f"\n## {title} ({now})\n\ncommit: {git_commit()}; {machine_line(threads)}\n\n{body}\n"
    existing = target.read_text() if target.exists() else _HEADER
    target.write_text(existing + section)
