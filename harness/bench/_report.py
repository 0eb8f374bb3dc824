"""Where a benchmark result came from (date, commit, machine, threads) and how it is appended to
the file `--output` names (the project's own record is docs/benchmarks.md)."""

from __future__ import annotations

from collections.abc import Mapping

import argparse
import datetime
import os
from pathlib import Path

from harness.provenance import git_commit, machine_line

__all__ = ["add_output_options", "append_section", "machine_line", "require_at_least"]

_HEADER = "# Benchmarks\n\nAppended by `harness bench NAME --output FILE`; newest last.\n"


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """`--output FILE` and `--no-write`: a benchmark writes only where it is told to."""
    parser.add_argument("--output", metavar="FILE", help="also append the results to FILE "
                        "(e.g. docs/benchmarks.md); default: print only")
    parser.add_argument("--no-write", action="store_true", help="print only, even with --output")


def require_at_least(parser: argparse.ArgumentParser, args: argparse.Namespace, minimum: int,
                     *names: str) -> None:
    """A one-line usage error for the first option among `names` below `minimum`."""
    for name in names:
        value = getattr(args, name.replace("-", "_"))
        if value < minimum:
            parser.error(f"--{name} must be at least {minimum}, got {value}")


def refuse_fallbacks(engine, what: str, compiles_before: Mapping[str, int] | None = None) -> None:
    """Raise when `engine` fell back (a piece or a step ran eagerly, a recompile): what was timed
    is then not the graphs' figure. `what` opens the message ("16 tokens: the piecewise run").
    `compiles_before`: the engine's eager compiles when the timed steps began (those of a warmup
    are not the timed steps')."""
    fallbacks = {reason: n for reason, n in engine.stats.fallbacks.items() if n}
    if fallbacks:
        raise RuntimeError(f"{what} fell back: {fallbacks}")
    # Not fallbacks, but a compile inside the timed steps is not the steps' figure either.
    before = compiles_before or {}
    compiles = {reason: n - before.get(reason, 0) for reason, n in engine.stats.eager_compiles.items()
                if n > before.get(reason, 0)}
    if compiles:
        raise RuntimeError(f"{what} compiled while timed: {compiles}")


def append_section(path: str | os.PathLike, title: str, body: str, *, threads: int) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    section = f"\n## {title} ({now})\n\ncommit: {git_commit()}; {machine_line(threads)}\n\n{body}\n"
    existing = target.read_text() if target.exists() else _HEADER
    target.write_text(existing + section)
