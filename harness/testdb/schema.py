"""What a test-db list is made of: conditions, test lines, blocks and lists.

The shape follows TensorRT-LLM's integration lists (`version`, then named lists of
`{condition: {ranges, wildcards, terms}, tests: [...]}` blocks); the keys are this project's.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from harness.device_options import EmulatedDevice
from harness.records import BACKENDS

RANGE_KEYS = ("gpu_count",)
WILDCARD_KEYS = ("gpu",)
TERM_VALUES = {
    "stage": ("pre_merge", "nightly"),
    "backend": tuple(name for name in reversed(BACKENDS) if name != "auto"),  # emulated, cuda
}

_TIMEOUT = re.compile(r"\((\d+)\)")


class TestDbError(ValueError):
    """A list that cannot be loaded or a line that cannot be parsed; the message says where."""

    __test__ = False  # not a pytest test class, despite the name


@dataclass(frozen=True)
class Range:
    """Inclusive bounds; None leaves that side open."""

    gte: int | None = None
    lte: int | None = None

    def contains(self, value: int) -> bool:
        return (self.gte is None or value >= self.gte) and (self.lte is None or value <= self.lte)


@dataclass(frozen=True)
class Condition:
    """Every entry must hold for the block to apply; an empty condition applies everywhere.

    ranges: fact -> Range; wildcards: fact -> fnmatch patterns (any may match, case-insensitive);
    terms: fact -> allowed values (any may match).
    """

    ranges: tuple[tuple[str, Range], ...] = ()
    wildcards: tuple[tuple[str, tuple[str, ...]], ...] = ()
    terms: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class TestLine:
    """One entry of a block: a pytest node id, file or folder, with optional filters and timeout."""

    __test__ = False

    test: str
    keyword: str | None = None  # -k
    marker: str | None = None  # -m
    timeout: int | None = None  # seconds, for a pytest process of its own
    emulation: EmulatedDevice | None = None  # its block's `emulate_cuda` field: run under the emulated device
    engine_compile: str | None = None  # its block's `engine_compile` field: pytest --engine-compile

    @property
    def path(self) -> str:
        """The file or folder part of the test id."""
        return self.test.split("::", 1)[0]

    def __str__(self) -> str:
        parts = [self.test]
        if self.keyword is not None:
            parts.append(f"-k {_quote(self.keyword)}")
        if self.marker is not None:
            parts.append(f"-m {_quote(self.marker)}")
        if self.timeout is not None:
            parts.append(f"TIMEOUT ({self.timeout})")
        if self.emulation is not None:
            parts.append(f"# under {self.emulation}")
        if self.engine_compile is not None:
            parts.append(f"# engines compile={self.engine_compile}")
        return " ".join(parts)


@dataclass(frozen=True)
class Block:
    condition: Condition
    tests: tuple[TestLine, ...]
    emulation: EmulatedDevice | None = None  # `emulate_cuda: true` or `{total_memory: 8GiB, ...}`
    engine_compile: str | None = None  # `engine_compile: inductor`: the suites' engines compiled


@dataclass(frozen=True)
class TestList:
    """A named list (a "context" in TensorRT-LLM's terms) and the file it came from."""

    __test__ = False

    name: str
    source: str
    blocks: tuple[Block, ...]


def _quote(expr: str) -> str:
    # Double quotes, as the lists are written, unless the expression itself holds one.
    return f'"{expr}"' if '"' not in expr and "\\" not in expr else shlex.quote(expr)


def parse_line(text: str) -> TestLine:
    """Parse `TEST [-k "expr"] [-m "expr"] [TIMEOUT (s)] [# comment]`; raises TestDbError naming the
    part that does not fit."""
    text = text.strip()
    test, _, rest = text.replace("\t", " ").partition(" ")
    if not test or test.startswith(("#", "-")):
        raise TestDbError(f"line {text!r} does not start with a test id, file or folder")
    if test.startswith("/"):
        raise TestDbError(f"line {text!r}: test {test!r} must be relative to the project root")
    try:
        tokens = shlex.split(rest, comments=True)
    except ValueError as err:  # unbalanced quotes
        raise TestDbError(f"line {text!r}: {err}") from None

    options: dict[str, str] = {}
    timeout = None
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in ("-k", "-m"):
            if token in options:
                raise TestDbError(f"line {text!r}: {token} given twice")
            if i + 1 >= len(tokens) or not tokens[i + 1].strip():
                raise TestDbError(f"line {text!r}: {token} needs an expression")
            options[token] = tokens[i + 1]
            i += 2
        elif token == "TIMEOUT":
            match = _TIMEOUT.fullmatch(tokens[i + 1]) if i + 1 < len(tokens) else None
            if match is None or timeout is not None:
                raise TestDbError(f"line {text!r}: TIMEOUT must appear once, as TIMEOUT (seconds)")
            timeout = int(match.group(1))
            if timeout < 1:
                raise TestDbError(f"line {text!r}: TIMEOUT ({timeout}) must be at least 1 second")
            i += 2
        else:
            raise TestDbError(f"line {text!r}: unexpected {token!r}; expected -k, -m, TIMEOUT (s) or # comment")
    return TestLine(test=test, keyword=options.get("-k"), marker=options.get("-m"), timeout=timeout)
