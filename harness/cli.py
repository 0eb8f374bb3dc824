"""The `harness` command: run | testdb | audit | lint | bench | faults | repro."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from pathlib import Path

from harness.testdb.schema import TERM_VALUES, TestDbError


def _machine_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("machine facts (default: this machine, as torch sees it)")
    group.add_argument("--gpu-count", type=int, help="number of GPUs (default: torch.cuda.device_count())")
    group.add_argument("--gpu", help="GPU name matched by wildcards (default: torch.cuda.get_device_name(0))")
    group.add_argument("--stage", choices=TERM_VALUES["stage"], default="pre_merge", help="default: pre_merge")
    group.add_argument("--backend", choices=TERM_VALUES["backend"],
                       help="graph backend (default: cuda when available, else emulated)")
    parser.add_argument("--test-db", type=Path, help="folder of list files (default: <project root>/test-db)")


def _machine(args):
    from harness.testdb import detect_machine

    return detect_machine(gpu_count=args.gpu_count, gpu=args.gpu, stage=args.stage, backend=args.backend)


def _testdb_dir(args) -> Path:
    from harness.testdb import project_root

    return args.test_db or project_root() / "test-db"


def cmd_run(args) -> int:
    from harness.testdb import get_list, project_root, run_list

    root = project_root()
    test_list = get_list(_testdb_dir(args), args.name)
    extra = list(args.pytest_args)
    if args.hypothesis_profile:
        extra += ["--hypothesis-profile", args.hypothesis_profile]
    if args.hypothesis_seed is not None:
        extra += ["--hypothesis-seed", str(args.hypothesis_seed)]
    return run_list(test_list, _machine(args), root=root, results_dir=args.results or root / "results",
                    extra_args=tuple(extra))


def cmd_render(args) -> int:
    from harness.testdb import get_list, render_lines, select
    from harness.testdb.render import nothing_selected

    test_list = get_list(_testdb_dir(args), args.name)
    machine = _machine(args)
    lines = select(test_list, machine)
    if not lines:
        print(nothing_selected(test_list, machine), file=sys.stderr)
    sys.stdout.write(render_lines(lines))
    return 0


def cmd_lists(args) -> int:
    from harness.testdb import load_lists

    for name, test_list in sorted(load_lists(_testdb_dir(args)).items()):
        print(f"{name}  ({test_list.source}, {sum(len(b.tests) for b in test_list.blocks)} lines)")
    return 0


def cmd_check(args) -> int:
    from harness.testdb import check_coverage, collect_node_ids, load_lists, project_root

    report = check_coverage(load_lists(_testdb_dir(args)), collect_node_ids(project_root()))
    print(report)
    return 0 if report.ok else 1


def cmd_bench(args) -> int:
    import harness.bench as bench

    available = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_"))
    if args.name not in available:
        print(f"harness bench: unknown benchmark {args.name!r}; available: {', '.join(available) or 'none'}",
              file=sys.stderr)
        return 2
    return int(importlib.import_module(f"harness.bench.{args.name}").main(args.bench_args) or 0)


def cmd_audit_transformers(args) -> int:
    import signal

    from harness.audit.report import render_markdown, render_text
    from harness.audit.runner import AuditInterrupted, AuditResult, run_audit, select

    try:
        archs = select(args.arch)
    except ValueError as error:
        print(f"harness audit: {error}", file=sys.stderr)
        return 2
    resumed = AuditResult.load(args.resume) if args.resume else None

    def terminated(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    # `timeout` and batch schedulers send SIGTERM: stop like Ctrl-C, keeping the rows done.
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        result = run_audit(archs, dtype=args.dtype, backend=_resolved(args.graph_backend), jobs=args.jobs,
                           timeout_s=args.timeout, checkpoint=args.json,
                           done=resumed.rows if resumed else [], done_meta=resumed.meta if resumed else None)
    except AuditInterrupted as stop:
        where = f"; the rows done are in {args.json} (marked incomplete)" if args.json else ""
        print(f"harness audit: {stop}{where}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    if args.json:
        print(f"wrote {len(result.rows)} rows to {args.json}", file=sys.stderr)
    sys.stdout.write(render_markdown([result]) if args.markdown else render_text(result))
    return 0


def _resolved(backend: str) -> str:
    from harness.graphs import resolve_backend

    return resolve_backend(backend)


def cmd_audit_merge(args) -> int:
    from harness.audit.report import render_markdown, render_text
    from harness.audit.runner import AuditResult

    results = [AuditResult.load(path) for path in args.files]
    if args.markdown or len(results) > 1:
        sys.stdout.write(render_markdown(results))
    else:
        sys.stdout.write(render_text(results[0]))
    return 0


def cmd_lint(args) -> int:
    from harness.check.lint import lint_target

    try:
        with _emulated_cuda(args.emulate_cuda):
            report = lint_target(args.target, factory=args.factory)
    except (ImportError, AttributeError, ValueError) as error:
        print(f"harness lint: {error}", file=sys.stderr)
        return 2
    print(report)
    return 0 if report.clean else 1


def _emulated_cuda(on: bool):
    """`harness.emulate_cuda()` for the duration when `on` (the verbs' --emulate-cuda)."""
    import contextlib

    if not on:
        return contextlib.nullcontext()
    from harness import emulate_cuda

    return emulate_cuda()


def _emulate_cuda_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--emulate-cuda", action="store_true",
                        help=f"{what} inside harness.emulate_cuda(): code written for CUDA runs "
                             f"unmodified (the emulated CUDA device without a GPU, the graph "
                             f"sanitizer with one)")


def _commit(root: Path) -> str:
    import subprocess

    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def cmd_faults(args) -> int:
    import json

    from harness.faults import FAULTS
    from harness.faults.table import markdown_table, run_document, text_table

    if args.action == "merge":
        if not args.files:
            print("harness faults merge: name one or more JSON files written by --json", file=sys.stderr)
            return 2
        documents = [json.loads(Path(f).read_text()) for f in args.files]
        print(markdown_table(FAULTS, documents), end="")
        return 0
    if args.files:
        print(f"harness faults: unexpected arguments {args.files}", file=sys.stderr)
        return 2
    from harness.faults.run import project_root, run_zoo
    from harness.graphs import resolve_backend

    unknown = [name for name in args.only if name not in FAULTS]
    if unknown:
        print(f"harness faults: unknown faults {unknown}; known: {', '.join(FAULTS)}", file=sys.stderr)
        return 2
    faults = [FAULTS[name] for name in args.only] if args.only else list(FAULTS.values())
    backend = resolve_backend(args.graph_backend)
    root = project_root()
    print(f"[faults] {len(faults)} fault(s) on the {backend} backend, {args.jobs} at a time",
          file=sys.stderr, flush=True)
    runs = run_zoo(faults, backend=backend, jobs=args.jobs, root=root,
                   log=lambda line: print(line, file=sys.stderr, flush=True))
    document = run_document(runs, backend=backend, commit=_commit(root))
    if args.json:
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    print(markdown_table({r.name: FAULTS[r.name] for r in runs}, [document]) if args.markdown
          else text_table(runs))
    # Not plantable is reported, not failed: the table says why.
    return 0 if all(r.verdict in ("detected", "not plantable") for r in runs) else 1


def cmd_repro(args) -> int:
    from harness.repro import load_record, replay

    try:
        record = load_record(args.file)
    except ValueError as error:
        print(f"harness repro: {error}", file=sys.stderr)
        return 2
    fault = "" if record.fault is None or args.without_fault else f", fault {record.fault} planted"
    kind = "scenario" if record.scenario is not None else "pytest"
    print(f"[repro] {record.node_id} ({kind}, {record.backend}{fault}; recorded with torch {record.torch})",
          file=sys.stderr, flush=True)
    with _emulated_cuda(args.emulate_cuda and record.scenario is not None):
        result = replay(record, without_fault=args.without_fault,
                        extra_options=("--emulate-cuda",) if args.emulate_cuda else ())
    print(result.report)
    print(f"[repro] {'passes' if result.ok else 'still fails'}", file=sys.stderr)
    return 0 if result.ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harness", description="capture-harness: graph-capture correctness harness")
    verbs = parser.add_subparsers(dest="verb", required=True)

    run = verbs.add_parser("run", help="run a test-db list for this machine and summarise per suite")
    run.add_argument("name", help="list name, e.g. l0_cpu")
    _machine_options(run)
    run.add_argument("--results", type=Path, help="folder for JUnit XML (default: <project root>/results)")
    run.add_argument("--hypothesis-profile", choices=("ci", "nightly", "repro"),
                     help="Hypothesis profile for every pytest run (default: ci)")
    run.add_argument("--hypothesis-seed", type=int, help="Hypothesis seed for every pytest run")
    run.epilog = "Arguments after -- go to every pytest run, e.g. harness run l0_cpu -- -x"
    run.set_defaults(func=cmd_run)

    testdb = verbs.add_parser("testdb", help="inspect test-db lists").add_subparsers(dest="action", required=True)
    render = testdb.add_parser("render", help="print the tests a list selects for a machine")
    render.add_argument("name")
    _machine_options(render)
    render.set_defaults(func=cmd_render)
    lists = testdb.add_parser("lists", help="print the list names and their files")
    lists.add_argument("--test-db", type=Path)
    lists.set_defaults(func=cmd_lists)
    check = testdb.add_parser("check", help="fail when a list names a missing test or a test is in no list")
    check.add_argument("--test-db", type=Path)
    check.set_defaults(func=cmd_check)

    audit = verbs.add_parser("audit", help="capture audit of a model family").add_subparsers(
        dest="family", required=True)
    hf = audit.add_parser("transformers", help="every transformers causal LM built tiny: capture a decode "
                          "step with a static cache, replay it against eager, classify")
    hf.add_argument("--arch", action="append", metavar="PATTERN",
                    help="glob on model_type or class name (repeatable; default: all)")
    hf.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    hf.add_argument("--graph-backend", choices=("auto", "cuda", "emulated"), default="auto",
                    help="default auto: cuda when available, else emulated")
    hf.add_argument("-j", "--jobs", type=int, default=2, help="processes at a time (default 2)")
    hf.add_argument("--timeout", type=float, default=180.0, help="seconds per architecture (default 180)")
    hf.add_argument("--json", type=Path, help="also write the rows and their provenance to this file, "
                    "rewritten after every row (meta complete=false and remaining=N until the end)")
    hf.add_argument("--resume", type=Path, metavar="FILE",
                    help="keep the rows of this audit JSON (e.g. an interrupted --json) and run the rest")
    hf.add_argument("--markdown", action="store_true", help="print a markdown table instead of text")
    hf.set_defaults(func=cmd_audit_transformers)
    merge = audit.add_parser("merge", help="put audit JSON files side by side (e.g. cpu.json cuda.json)")
    merge.add_argument("files", nargs="+", type=Path)
    merge.add_argument("--markdown", action="store_true")
    merge.set_defaults(func=cmd_audit_merge)

    lint = verbs.add_parser("lint", help="capture lint: every capture hazard of a callable, in one pass")
    lint.add_argument("target", help="MODULE:CALLABLE, a callable taking no arguments (the step to lint)")
    lint.add_argument("--factory", action="store_true",
                      help="CALLABLE() builds the step (model, buffers) and returns the callable to lint")
    _emulate_cuda_option(lint, "lint")
    lint.set_defaults(func=cmd_lint)


    faults = verbs.add_parser("faults", help="plant every fault of the zoo and report which tests catch it")
    faults.add_argument("action", nargs="?", choices=("run", "merge"), default="run",
                        help="run (default) the zoo, or merge JSON files of earlier runs into markdown")
    faults.add_argument("files", nargs="*", type=Path, help="with merge: JSON files written by --json")
    faults.add_argument("--graph-backend", choices=("auto", "cuda", "emulated"), default="auto",
                        help="backend the detectors run on (default: auto)")
    faults.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only this fault (repeatable)")
    faults.add_argument("-j", "--jobs", type=int, default=1, help="faults run at a time (default 1)")
    faults.add_argument("--markdown", action="store_true", help="print the table as markdown")
    faults.add_argument("--json", type=Path, metavar="PATH", help="also write the run as JSON to PATH")
    faults.set_defaults(func=cmd_faults)

    repro = verbs.add_parser("repro", help="replay a reproduction file; exit 1 while it still fails")
    repro.add_argument("file", type=Path)
    repro.add_argument("--without-fault", action="store_true",
                       help="replay without the planted fault the file names")
    _emulate_cuda_option(repro, "replay")
    repro.set_defaults(func=cmd_repro)

    bench = verbs.add_parser("bench", help="run a benchmark from harness.bench")
    bench.add_argument("name")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Split by hand: argparse cannot take option-like strings as a trailing positional list.
    pytest_args: list[str] = []
    if argv[:1] == ["run"] and "--" in argv:
        cut = argv.index("--")
        argv, pytest_args = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(argv)
    args.pytest_args = pytest_args
    try:
        return args.func(args)
    except TestDbError as err:
        print(f"harness: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
