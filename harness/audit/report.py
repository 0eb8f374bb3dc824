"""Audit results as text: one column per result file (emulator on CPU, cuda on an H200, ...), side
by side, with each column's provenance and the reasons behind every verdict other than "agrees"."""

from __future__ import annotations

from collections import Counter

from harness.audit.classify import AGREES, VERDICTS, Row
from harness.audit.runner import AuditResult


def column_label(result: AuditResult) -> str:
    """"emulated bfloat16", "cuda float32", ...; a run inside emulate_cuda() is a column of its own,
    "emulate_cuda bfloat16" (the emulated backend on the emulated CUDA device)."""
    meta = result.meta
    backend = meta.get("backend", "?")
    if meta.get("emulate_cuda"):
        backend = "emulate_cuda" if backend == "emulated" else f"{backend} under emulate_cuda"
    return f"{backend} {meta.get('dtype', '?')}"


def verdict_cell(row: Row | None) -> str:
    if row is None:
        return "-"
    return f"{row.verdict} at step {row.step}" if row.step is not None else row.verdict


def _labels(results: list[AuditResult]) -> list[str]:
    labels = [column_label(r) for r in results]
    counts = Counter(labels)
    seen: Counter = Counter()
    unique = []
    for label in labels:
        seen[label] += 1
        unique.append(f"{label} ({seen[label]})" if counts[label] > 1 else label)
    return unique


def differing(results: list[AuditResult]) -> list[str]:
    """Model types whose verdict (with its step) is not the same in every column that has it."""
    cells: dict[str, set[str]] = {}
    for result in results:
        for row in result.rows:
            cells.setdefault(row.model_type, set()).add(verdict_cell(row))
    return sorted(t for t, seen in cells.items() if len(seen) > 1)


def render_markdown(results: list[AuditResult]) -> str:
    labels = _labels(results)
    by_column = [{r.model_type: r for r in result.rows} for result in results]
    types = sorted({t for column in by_column for t in column})
    classes = {t: column[t].class_name for column in by_column for t in column}
    lines = ["Provenance:", ""]
    for label, result in zip(labels, results):
        m = result.meta
        lines.append(f"- **{label}**: {m.get('date', '?')}, commit {m.get('commit', '?')}, torch "
                     f"{m.get('torch', '?')}, transformers {m.get('transformers', '?')}, "
                     f"{m.get('machine', '?')}, "
                     + ("inside harness.emulate_cuda() (the model on the emulated cuda device), "
                        if m.get("emulate_cuda") else "")
                     + f"{len(result.rows)} architectures in "
                     f"{m.get('wall_s', '?')} s with {m.get('jobs', '?')} processes"
                     + (f"; **incomplete**: {m.get('remaining', '?')} of {m.get('total', '?')} not reached"
                        if m.get("complete") is False else "")
                     + (f"; {m.get('resumed', '?')} of the rows kept from earlier runs ("
                        + "; ".join(f"{e['date']}, commit {e['commit']}, transformers {e['transformers']}"
                                    for e in m["resumed_from"]) + ")" if m.get("resumed_from") else ""))
    lines += ["", "| verdict | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for verdict in VERDICTS:
        counts = [sum(r.verdict == verdict for r in result.rows) for result in results]
        if any(counts):
            lines.append(f"| {verdict} | " + " | ".join(str(c) for c in counts) + " |")
    differ = set(differing(results)) if len(results) > 1 else set()
    lines += ["", "| architecture | class | " + " | ".join(labels) + (" | differs |" if len(results) > 1 else " |"),
              "|---|---|" + "---|" * len(labels) + ("---|" if len(results) > 1 else "")]
    for t in types:
        cells = [verdict_cell(column.get(t)) for column in by_column]
        mark = [("**yes**" if t in differ else "")] if len(results) > 1 else []
        lines.append("| " + " | ".join([t, f"`{classes[t]}`", *cells, *mark]) + " |")
    for label, result in zip(labels, results):
        reasons = [r for r in result.rows if r.verdict != AGREES]
        if not reasons:
            continue
        lines += ["", f"Reasons, {label}:", ""]
        lines += [f"- `{r.model_type}`: {verdict_cell(r)}: {_escape(r.detail)}" for r in reasons]
    return "\n".join(lines) + "\n"


def render_text(result: AuditResult) -> str:
    width = max((len(r.model_type) for r in result.rows), default=10)
    lines = [f"{r.model_type:<{width}}  {verdict_cell(r):<22}  {r.detail}" for r in result.rows]
    counts = Counter(r.verdict for r in result.rows)
    lines.append(", ".join(f"{counts[v]} {v}" for v in VERDICTS if counts[v]) +
                 f" ({column_label(result)}, {result.meta.get('wall_s', '?')} s)")
    return "\n".join(lines) + "\n"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
