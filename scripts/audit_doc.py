#!/usr/bin/env python3
"""Regenerate the tables of docs/audit-transformers.md from the audit JSON files in docs/audit/:
everything from the line `## Results` on is `harness audit merge` output; the prose above it is
kept as written. Prints each pair's counts and differing rows, for the prose to be checked against.

    python scripts/audit_doc.py            # rewrites docs/audit-transformers.md in place
    python scripts/audit_doc.py --check    # exit 1 when the file is not what the JSONs give
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.audit.report import column_label, differing, render_markdown  # noqa: E402
from harness.audit.runner import AuditResult  # noqa: E402

DOC = ROOT / "docs" / "audit-transformers.md"
AUDIT = ROOT / "docs" / "audit"
DTYPES = ("bfloat16", "float32")
# (section title, the files merged side by side, {dtype} filled in)
SECTIONS = (
    ("Results: the emulator beside cuda on the H200 (2026-11-30)",
     ("emulated_{dtype}.json", "cuda_2026-11-30_{dtype}.json")),
    ("Results: emulate_cuda() on the CPU wheel beside cuda on the H200",
     ("cuda_{dtype}.json", "ci/emulate_cuda_{dtype}.json")),
    ("Results: emulate_cuda() on the CUDA wheel without a GPU beside cuda on the H200",
     ("cuda_{dtype}.json", "ci/emulate_cuda_cu214_{dtype}.json")),
)
RESULTS = "## Results"


def tables() -> str:
    parts = []
    for title, files in SECTIONS:
        parts += [f"## {title}", ""]
        for dtype in DTYPES:
            results = [AuditResult.load(AUDIT / f.format(dtype=dtype)) for f in files]
            parts += [f"### {dtype}", "", render_markdown(results)]
            summary = ", ".join(f"{column_label(r)} ({_counts(r)})" for r in results)
            print(f"{title}, {dtype}: {summary}; {len(differing(results))} rows differ", file=sys.stderr)
    return "\n".join(parts)


def _counts(result: AuditResult) -> str:
    from collections import Counter

    from harness.audit.classify import VERDICTS

    counts = Counter(r.verdict for r in result.rows)
    return "/".join(str(counts[v]) for v in VERDICTS if v in counts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/audit_doc.py")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = DOC.read_text()
    if RESULTS + ":" not in text:
        raise SystemExit(f"{DOC}: no line {RESULTS!r} to regenerate from")
    wanted = text[:text.index(RESULTS + ":")] + tables()
    if args.check:
        return 0 if wanted == text else 1
    DOC.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
