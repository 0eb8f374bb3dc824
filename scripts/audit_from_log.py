"""One-off: turn the progress lines of an interrupted `harness audit transformers` run
("[i/N] arch: verdict [at step k] (12.3s)") into an audit JSON with verdicts only, marked incomplete.

Written for the H200 run of 2026-11-30, killed by `timeout` before its --json was written (the audit
now rewrites --json after every row, so this is not needed again). Not a feature: the rows have no
detail; class names come from the local transformers. Usage:

    python scripts/audit_from_log.py LOG OUT.json --backend cuda --dtype bfloat16 --jobs 6 \\
        --commit d1cb64a --torch 2.11.0+cu130 --transformers 5.17.0 --python 3.12.3 \\
        --machine "NVIDIA H200, 32 CPU cores" --date "2026-11-30"
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from harness.audit.classify import VERDICTS, Row
from harness.audit.runner import AuditResult

LINE = re.compile(r"^\[(\d+)/(\d+)\] (\S+): (.+?)(?: at step (\d+))? \(([\d.]+)s\)$")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("out", type=Path)
    for name in ("backend", "dtype", "commit", "torch", "transformers", "python", "machine", "date"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--jobs", type=int, required=True)
    args = parser.parse_args()
    try:
        from harness.audit.tiny import causal_lm_architectures

        classes = {a.model_type: a.class_name for a in causal_lm_architectures()}
    except Exception as error:  # the local transformers may lack a class: the name is cosmetic
        print(f"class names unavailable ({error}); using '?'")
        classes = {}
    rows, total = [], None
    for line in args.log.read_text().splitlines():
        match = LINE.match(line.strip())
        if not match:
            continue
        _, n, model_type, verdict, step, seconds = match.groups()
        if verdict not in VERDICTS:
            raise ValueError(f"{args.log}: unknown verdict {verdict!r} in {line!r} (known: {VERDICTS})")
        total = int(n)
        rows.append(Row(model_type, classes.get(model_type, "?"), args.dtype, args.backend, verdict,
                        "(from the progress log: verdict only)", int(step) if step else None, float(seconds)))
    rows.sort(key=lambda r: r.model_type)
    meta = {"date": args.date, "commit": args.commit, "torch": args.torch, "transformers": args.transformers,
            "python": args.python, "machine": args.machine, "dtype": args.dtype, "backend": args.backend,
            "jobs": args.jobs, "wall_s": "?", "total": total, "remaining": total - len(rows),
            "complete": False, "source": f"progress log {args.log.name} of a run killed by timeout 470"}
    AuditResult(meta, rows).save(args.out)
    print(f"{args.out}: {len(rows)} of {total} rows")


if __name__ == "__main__":
    main()
