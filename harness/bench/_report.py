"""Where a benchmark result came from (date, commit, machine, threads) and how it is appended to
the file `--output` names (the project's own record is docs/benchmarks.md)."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

from harness.provenance import git_commit, machine_line

__all__ = ["append_section", "machine_line"]

_HEADER = "# Benchmarks\n\nAppended by `harness bench NAME --output FILE`; newest last.\n"


def append_section(path: str | os.PathLike, title: str, body: str, *, threads: int) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    section = f"\n## {title} ({now})\n\ncommit: {git_commit()}; {machine_line(threads)}\n\n{body}\n"
    existing = target.read_text() if target.exists() else _HEADER
    target.write_text(existing + section)
