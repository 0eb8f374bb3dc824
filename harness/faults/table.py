"""The fault table: one run as text or JSON, and several runs (the emulator on CPU, cuda on the
H200) merged into the markdown of docs/faults.md."""

from __future__ import annotations

from typing import Mapping, Sequence

from harness.faults.registry import Fault
from harness.faults.run import FaultRun


def run_document(runs: Sequence[FaultRun], *, backend: str, commit: str | None = None,
                 engine_compile: str | None = None) -> dict:
    """A run as JSON-able data, with where it ran (commit: the checkout's, unless given) and the
    engine path of its detectors (`engine_compile`, pytest's --engine-compile; None: not given)."""
    from harness.provenance import device_name, git_commit, versions

    document = {"backend": backend, "device": device_name(backend), "torch": versions()["torch"],
                "commit": git_commit() if commit is None else commit,
                "runs": [r.to_dict() for r in runs]}
    if engine_compile is not None:
        document["engine_compile"] = engine_compile
    return document


def text_table(runs: Sequence[FaultRun]) -> str:
    rows = [("fault", "verdict", "detector", "seconds")]
    rows += [(r.name, r.verdict, r.detector, f"{r.seconds:.1f}") for r in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    details = [f"\n{r.name}: {r.detail}" for r in runs if r.detail and not r.detected]
    return "\n".join(lines) + "".join(details)


def _cell(run: Mapping | None) -> str:
    if run is None:
        return "not run"
    if run["verdict"] in ("not plantable", "not applicable"):
        return run["detail"] if run["detail"].startswith(run["verdict"]) else \
            f"{run['verdict']}: {run['detail']}"
    return f"{run['verdict']} ({run['seconds']:.1f} s)"


def _head(document: Mapping) -> str:
    """A run's column: its backend, and the engine path when its detectors ran on the compiled one."""
    compiled = document.get("engine_compile")
    path = f", engines compile={compiled}" if compiled not in (None, "none") else ""
    return f"{document['backend']} ({document['device']}, torch {document['torch']}{path})"


def markdown_table(faults: Mapping[str, Fault], documents: Sequence[Mapping]) -> str:
    """One row per registered fault, one column per run document."""
    heads = [_head(d) for d in documents]
    lines = ["| fault | bug class | public report | detector | " + " | ".join(heads) + " |",
             "| --- | --- | --- | --- | " + " | ".join("---" for _ in heads) + " |"]
    by_name = [{r["name"]: r for r in d["runs"]} for d in documents]
    for name, fault in faults.items():
        cells = [_cell(runs.get(name)).replace("|", "\\|") for runs in by_name]
        lines.append(f"| `{name}` | {fault.bug_class} | {fault.link} | `{fault.detector}` | "
                     + " | ".join(cells) + " |")
    provenance = [f"- {head}: commit {d.get('commit') or 'unknown'}" for head, d in zip(heads, documents)]
    return "\n".join(lines + [""] + provenance) + "\n"
