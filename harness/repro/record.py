"""Reproduction files: what a failing suite test writes to `repro/<test id>.json`."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from harness.repro.scenario import Scenario

FORMAT = 1


@dataclass(frozen=True)
class ReproRecord:
    """- `node_id`, `root`: the failing test and the project it ran in.
    - `backend`: the graph backend it ran on (resolved: "emulated" or "cuda").
    - `pytest_options`: the options that re-run it the same way (backend, Hypothesis profile/seed).
    - `seeds`: Hypothesis' seed option and torch's initial seed of the failing session.
    - `hypothesis_example`: the "Falsifying example" Hypothesis printed, if any.
    - `fault`: the planted fault, if any. `scenario`: an engine-level comparison the test recorded
      (replayed standalone, without pytest); None for other tests.
    - `failure`: the head of the failure, for the reader. `torch`: torch's version.
    """

    node_id: str
    backend: str
    torch: str
    root: str = ""
    pytest_options: tuple[str, ...] = ()
    seeds: Mapping[str, Any] = field(default_factory=dict)
    hypothesis_example: str | None = None
    fault: str | None = None
    scenario: Scenario | None = None
    failure: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "node_id": self.node_id, "root": self.root, "backend": self.backend,
                "torch": self.torch, "pytest_options": list(self.pytest_options),
                "seeds": dict(self.seeds), "hypothesis_example": self.hypothesis_example,
                "fault": self.fault,
                "scenario": None if self.scenario is None else self.scenario.to_dict(),
                "failure": self.failure}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReproRecord:
        if data.get("format") != FORMAT:
            raise ValueError(f"reproduction file format {data.get('format')!r}; this harness reads {FORMAT}")
        scenario = data.get("scenario")
        return cls(node_id=data["node_id"], root=data.get("root", ""), backend=data["backend"],
                   torch=data["torch"], pytest_options=tuple(data.get("pytest_options", ())),
                   seeds=dict(data.get("seeds", {})), hypothesis_example=data.get("hypothesis_example"),
                   fault=data.get("fault"),
                   scenario=None if scenario is None else Scenario.from_dict(scenario),
                   failure=data.get("failure", ""))


def file_name(node_id: str) -> str:
    """`repro/<test id>.json`: the node id with every character outside [A-Za-z0-9._-] as '_'."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", node_id) + ".json"


def write_record(record: ReproRecord, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file_name(record.node_id)
    data = record.to_dict()
    if record.scenario is not None:
        data["explain"] = f"harness explain {path}"  # the command that explains it, for the reader
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def load_record(path: Path) -> ReproRecord:
    try:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict):
            raise TypeError(f"a JSON {type(data).__name__}, expected an object")
        return ReproRecord.from_dict(data)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is not a reproduction file: {type(error).__name__}: {error}") from error


_EXAMPLE_HEADS = ("Falsifying example:", "Failing test case:")  # Hypothesis' wording varies by version
_PREFIX = re.compile(r"^(E\s+|\s*\|\s?)")  # pytest's "E" lines, an exception group's "|" lines


def hypothesis_example(failure_text: str) -> str | None:
    """The first example Hypothesis reported ("Falsifying example: ..." or "Failing test case: ...",
    up to its closing parenthesis), or None."""
    lines = failure_text.splitlines()
    for i, line in enumerate(lines):
        if any(head in line for head in _EXAMPLE_HEADS):
            block = [line]
            for following in lines[i + 1:]:
                if not following.strip():
                    break
                block.append(following)
                if _PREFIX.sub("", following).strip() == ")":
                    break
            return "\n".join(block).strip()
    return None
