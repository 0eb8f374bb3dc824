"""Where a benchmark result came from (date, commit, machine) and how it lands in
docs/benchmarks.md."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

from harness.provenance import git_commit, machine_line

__all__ = ["append_section", "machine_line"]

_HEADER = "# Benchmarks\n\nAppended by `harness bench NAME`; newest last.\n"


def append_section(path: str | os.PathLike, title: str, body: str) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    section = f"\n## {title} ({now})\n\ncommit: {git_commit()}; {machine_line()}\n\n{body}\n"
    existing = target.read_text() if target.exists() else _HEADER
    target.write_text(existing + section)
