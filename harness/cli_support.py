"""What every `harness` verb shares for bad input: one line naming the bad value and what is
accepted, and exit code 2 (`UsageError`), checked before any work starts."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

USAGE_EXIT = 2


class UsageError(Exception):
    """Bad input from the command line; `main` prints it as one line and exits 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse's errors as one line (`prog: message (see prog --help)`), exit 2."""

    def error(self, message: str):
        self.exit(USAGE_EXIT, f"{self.prog}: {message} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; expected 1 or more") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not accepted; expected 1 or more")
    return value


def require_cuda(option: str, instead: str) -> None:
    """Refuse `option` (e.g. "--graph-backend cuda") up front on a machine without CUDA."""
    import torch

    if not torch.cuda.is_available():
        raise UsageError(f"{option} needs CUDA, but torch.cuda.is_available() is False "
                         f"(torch {torch.__version__}); {instead}")


def require_backend(option: str, backend: str) -> None:
    """`option backend` where backend is auto|cuda|emulated: cuda needs CUDA."""
    if backend == "cuda":
        require_cuda(f"{option} cuda", f"use {option} emulated or auto")


def read_json(path: Path, what: str, *, expect: type = dict) -> Any:
    """The JSON document at `path`, which must be a `what` (a JSON object by default)."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as error:
        raise UsageError(f"{path}: cannot read it ({error.strerror or error}); expected {what}") from None
    except ValueError as error:
        raise UsageError(f"{path}: not JSON ({error}); expected {what}") from None
    if not isinstance(data, expect):
        raise UsageError(f"{path}: a JSON {type(data).__name__}; expected {what}")
    return data


def report_usage_error(verb: str, error: UsageError) -> int:
    print(f"harness {verb}: {error}", file=sys.stderr)
    return USAGE_EXIT
