"""The `harness` command: run | testdb | audit | lint | bench | faults | repro | explain."""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from pathlib import Path

from harness.cli_support import (
    OneLineParser, UsageError, positive_int, read_json, report_usage_error, require_backend,
)
from harness.testdb.commands import (
    cmd_check, cmd_lists, cmd_render, cmd_run, emulation_options, machine_options, project_options,
)
from harness.pytest_plugin import PROFILES as HYPOTHESIS_PROFILES
from harness.records import BACKENDS
from harness.testdb.schema import TestDbError


def benchmarks() -> list[str]:
    import harness.bench as bench

    return sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_"))


def cmd_bench(args) -> int:
    available = benchmarks()
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
        raise UsageError(str(error)) from None
    if args.list:
        for arch in archs:
            print(f"{arch.model_type}  {arch.class_name}")
        return 0
    backend = _audit_backend(args.graph_backend, args.emulate_cuda)
    resumed = _audit_file(args.resume, "--resume") if args.resume else None

    def terminated(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    # `timeout` and batch schedulers send SIGTERM: stop like Ctrl-C, keeping the rows done.
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        result = run_audit(archs, dtype=args.dtype, backend=backend, jobs=args.jobs,
                           timeout_s=args.timeout, checkpoint=args.json,
                           done=resumed.rows if resumed else [], done_meta=resumed.meta if resumed else None,
                           emulate_cuda=args.emulate_cuda)
    except ValueError as error:
        raise UsageError(str(error)) from None
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


def _audit_file(path: Path, option: str):
    from harness.audit.runner import AuditResult

    data = read_json(path, "an audit JSON file written by --json")
    try:
        return AuditResult.from_dict(data)
    except (KeyError, TypeError, ValueError) as error:
        raise UsageError(f"{option} {path}: not an audit JSON file ({type(error).__name__}: {error}); "
                         f"expected one written by harness audit transformers --json") from None


def _audit_backend(option: str, emulate_cuda: bool) -> str:
    """The backend the audit's children capture with. Under --emulate-cuda that is the emulated
    backend on the "cuda" device (what `auto` resolves to inside emulate_cuda()), which captures
    through torch.cuda.graph; the parent resolves it without entering the emulation itself."""
    from harness.graphs import resolve_backend

    if not emulate_cuda:
        require_backend("--graph-backend", option)
        return resolve_backend(option)
    if option not in ("auto", "emulated"):
        raise UsageError(f"--graph-backend {option} with --emulate-cuda: under emulate_cuda() the "
                         f"audit captures through torch.cuda.graph on the emulated device; accepted: "
                         f"auto or emulated")
    return "emulated"


def cmd_audit_merge(args) -> int:
    from harness.audit.report import render_markdown, render_text
    results = [_audit_file(path, "merge") for path in args.files]
    if args.markdown or len(results) > 1:
        sys.stdout.write(render_markdown(results))
    else:
        sys.stdout.write(render_text(results[0]))
    return 0


LINT_TARGET_FAILED = 3


def cmd_lint(args) -> int:
    import dataclasses
    import json

    from harness.check.lint import TargetFailed, lint_target

    try:
        with _emulated_cuda(args.emulate_cuda):
            report = lint_target(args.target, factory=args.factory)
    except TargetFailed as error:
        print(f"harness lint: the target failed, nothing was linted: {error}", file=sys.stderr)
        return LINT_TARGET_FAILED
    except (ImportError, AttributeError, ValueError) as error:
        raise UsageError(str(error)) from None
    if args.json:
        print(json.dumps({"clean": report.clean, **dataclasses.asdict(report)}, indent=1))
    else:
        print(report)
    return 0 if report.clean else 1


def _emulated_cuda(on: bool):
    """`harness.emulate_cuda()` for the duration when `on` (the verbs' --emulate-cuda); inside an
    emulation already in force (a pytest session under --emulate-cuda calling `cli.main`), that
    one: a second would be refused, and the verbs take the device's default settings, which the
    session's may refine (a schedule explain cannot observe is refused by explain itself)."""
    import contextlib

    from harness.emulation import emulation_active

    if not on or emulation_active() is not None:
        return contextlib.nullcontext()
    from harness import emulate_cuda

    return emulate_cuda()


def _emulate_cuda_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--emulate-cuda", action="store_true",
                        help=f"{what} inside harness.emulate_cuda(): code written for CUDA runs "
                             f"unmodified (the emulated CUDA device without a GPU, the graph "
                             f"sanitizer with one)")


def cmd_faults(args) -> int:
    import json

    from harness.faults import FAULTS
    from harness.faults.table import markdown_table, run_document, text_table

    if args.action == "merge":
        if not args.files:
            print("harness faults merge: name one or more JSON files written by --json", file=sys.stderr)
            return 2
        expected = "a JSON file written by harness faults --json"
        documents = [read_json(f, expected) for f in args.files]
        for path, document in zip(args.files, documents):
            missing = [key for key in ("backend", "device", "torch", "runs") if key not in document]
            if missing:
                raise UsageError(f"{path}: no {', '.join(missing)}; expected {expected}")
        print(markdown_table(FAULTS, documents), end="")
        return 0
    if args.files:
        print(f"harness faults: unexpected arguments {args.files}", file=sys.stderr)
        return 2
    from harness.faults.run import default_jobs, run_zoo
    from harness.provenance import checkout_root
    from harness.graphs import resolve_backend

    unknown = [name for name in args.only if name not in FAULTS]
    if unknown:
        print(f"harness faults: unknown faults {unknown}; known: {', '.join(FAULTS)}", file=sys.stderr)
        return 2
    faults = [FAULTS[name] for name in args.only] if args.only else list(FAULTS.values())
    require_backend("--graph-backend", args.graph_backend)
    backend = resolve_backend(args.graph_backend)
    root = checkout_root()
    jobs = args.jobs or default_jobs()
    from harness.faults.sessions import session_kind

    path = f", engines compile={args.engine_compile}" if args.engine_compile else ""
    print(f"[faults] {len(faults)} fault(s) on the {backend} backend{path}, {jobs} planted runs at "
          f"a time, pytest sessions {session_kind()}", file=sys.stderr, flush=True)
    runs = run_zoo(faults, backend=backend, jobs=jobs, root=root, engine_compile=args.engine_compile,
                   log=lambda line: print(line, file=sys.stderr, flush=True))
    document = run_document(runs, backend=backend, engine_compile=args.engine_compile)
    if args.json:
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    print(markdown_table({r.name: FAULTS[r.name] for r in runs}, [document]) if args.markdown
          else text_table(runs))
    # Not plantable and not applicable are reported, not failed: the table says why.
    return 0 if all(r.verdict in ("detected", "not plantable", "not applicable") for r in runs) else 1


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
    from harness.runtime.config import engine_defaults_from_env

    with _emulated_cuda(args.emulate_cuda and record.scenario is not None):
        result = replay(record, without_fault=args.without_fault,
                        engine_defaults=engine_defaults_from_env(os.environ),
                        extra_options=("--emulate-cuda",) if args.emulate_cuda else ())
    print(result.report)
    print(f"[repro] {'passes' if result.ok else 'still fails'}", file=sys.stderr)
    return 0 if result.ok else 1


# --- harness explain (issue 20): kept in one block -------------------------------------------------

def cmd_explain(args) -> int:
    from harness.check.explain_cuda import ReplaysNotObserved
    from harness.repro.explain import explain_entry_point, explain_fault, explain_file

    if (args.file is None) == (args.fault is None):
        print("harness explain: give a reproduction FILE, FILE.py::FUNCTION or --fault NAME (one of them)",
              file=sys.stderr)
        return 2
    entry_point = args.file is not None and ("::" in args.file or args.file.endswith(".py"))
    if entry_point and args.without_fault:
        print("harness explain: --without-fault is for reproduction files; FILE.py::FUNCTION has no fault",
              file=sys.stderr)
        return 2
    try:
        if entry_point:  # code written against torch.cuda: always on the emulated device (or sanitizer)
            with _emulated_cuda(True):
                explanation = explain_entry_point(args.file, context=args.context)
        else:
            with _emulated_cuda(args.emulate_cuda):
                if args.fault is not None:
                    explanation = explain_fault(args.fault, context=args.context)
                else:
                    explanation = explain_file(Path(args.file), without_fault=args.without_fault,
                                               context=args.context)
    except (ValueError, KeyError, ReplaysNotObserved) as error:
        print(f"harness explain: {error}", file=sys.stderr)
        return 2
    print(explanation)
    return 1 if explanation.diverged or explanation.raised else 0


def _add_explain(verbs) -> None:
    explain = verbs.add_parser("explain", help="the first op (and source line) where a replay departs "
                               "from eager, the input that differs and why; exit 1 when one does")
    explain.add_argument("file", nargs="?", metavar="FILE",
                         help="a reproduction file with an engine scenario, or FILE.py::FUNCTION: your "
                              "code, FUNCTION(graphed=True) explained against FUNCTION(graphed=False)")
    explain.add_argument("--fault", metavar="NAME", help="explain the fault zoo entry's own reproduction")
    explain.add_argument("--without-fault", action="store_true", help="explain without the file's fault")
    explain.add_argument("--context", type=int, default=3, help="agreeing ops shown before it (default 3)")
    _emulate_cuda_option(explain, "explain (the engine on the emulated \"cuda\" device, graphs through torch.cuda)")
    explain.set_defaults(func=cmd_explain)

# --- end of harness explain ----------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="harness", description="capture-harness: graph-capture correctness harness")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    verbs = parser.add_subparsers(dest="verb", required=True)

    run = verbs.add_parser("run", help="run a test-db list for this machine and summarise per suite")
    run.add_argument("name", help="list name, e.g. l0_cpu")
    machine_options(run)
    run.add_argument("--results", type=Path, help="folder for JUnit XML (default: <project root>/results)")
    run.add_argument("--hypothesis-profile", choices=HYPOTHESIS_PROFILES,
                     help="Hypothesis profile for every pytest run (default: ci)")
    run.add_argument("--hypothesis-seed", type=int, help="Hypothesis seed for every pytest run")
    emulation_options(run)
    run.add_argument("--json", type=Path, metavar="FILE",
                     help="also write the summary (suites, failed tests, reproduction files, skips by "
                          "reason, what a signal cut) as JSON to FILE")
    run.epilog = ("Arguments after -- go to every pytest run, e.g. harness run l0_cpu -- -x --lf. "
                  "SIGINT or SIGTERM stops the run's pytest processes, prints the partial table and "
                  "exits 130 or 143.")
    run.set_defaults(func=cmd_run)

    testdb = verbs.add_parser("testdb", help="inspect test-db lists").add_subparsers(dest="action", required=True)
    render = testdb.add_parser("render", help="print the tests a list selects for a machine")
    render.add_argument("name")
    machine_options(render)
    render.set_defaults(func=cmd_render)
    lists = testdb.add_parser("lists", help="print the list names and their files")
    project_options(lists)
    lists.set_defaults(func=cmd_lists)
    check = testdb.add_parser("check", help="fail when a list names a missing test or a test in the "
                              "folders the lists name is in no list")
    project_options(check)
    check.set_defaults(func=cmd_check)

    audit = verbs.add_parser("audit", help="capture audit of a model family").add_subparsers(
        dest="family", required=True)
    hf = audit.add_parser("transformers", help="every transformers causal LM built tiny: capture a decode "
                          "step with a static cache, replay it against eager, classify")
    hf.add_argument("--arch", action="append", metavar="PATTERN",
                    help="glob on model_type or class name, any case (repeatable; default: all)")
    hf.add_argument("--list", action="store_true",
                    help="print the model types (and classes) --arch selects, and run nothing")
    hf.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    hf.add_argument("--graph-backend", choices=BACKENDS, default="auto",
                    help="default auto: cuda when available, else emulated")
    hf.add_argument("-j", "--jobs", type=positive_int, default=2, help="processes at a time (default 2)")
    hf.add_argument("--timeout", type=float, default=180.0, help="seconds per architecture (default 180)")
    hf.add_argument("--json", type=Path, help="also write the rows and their provenance to this file, "
                    "rewritten after every row (meta complete=false and remaining=N until the end)")
    hf.add_argument("--resume", type=Path, metavar="FILE",
                    help="keep the rows of this audit JSON (e.g. an interrupted --json) and run the rest")
    hf.add_argument("--markdown", action="store_true", help="print a markdown table instead of text")
    _emulate_cuda_option(hf, "audit each architecture (in its own process)")
    hf.set_defaults(func=cmd_audit_transformers)
    merge = audit.add_parser("merge", help="put audit JSON files side by side (e.g. cpu.json cuda.json)")
    merge.add_argument("files", nargs="+", type=Path)
    merge.add_argument("--markdown", action="store_true")
    merge.set_defaults(func=cmd_audit_merge)

    lint = verbs.add_parser("lint", help="capture lint: every capture hazard of a callable, in one pass")
    lint.add_argument("target", help="MODULE:CALLABLE, a callable taking no arguments (the step to lint)")
    lint.add_argument("--factory", action="store_true",
                      help="CALLABLE() builds the step (model, buffers) and returns the callable to lint")
    lint.add_argument("--json", action="store_true", help="print the report as JSON")
    _emulate_cuda_option(lint, "lint")
    lint.epilog = (f"Exit code 0 clean, 1 hazards found, 2 a bad target, {LINT_TARGET_FAILED} the target "
                   "raised while being imported or built (the message names the file)")
    lint.set_defaults(func=cmd_lint)


    faults = verbs.add_parser("faults", help="plant every fault of the zoo and report which tests catch it")
    faults.add_argument("action", nargs="?", choices=("run", "merge"), default="run",
                        help="run (default) the zoo, or merge JSON files of earlier runs into markdown")
    faults.add_argument("files", nargs="*", type=Path, help="with merge: JSON files written by --json")
    faults.add_argument("--graph-backend", choices=BACKENDS, default="auto",
                        help="backend the detectors run on (default: auto)")
    faults.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only this fault (repeatable)")
    faults.add_argument("-j", "--jobs", type=positive_int, default=None,
                        help="planted runs at a time (default: one per CPU core)")
    faults.add_argument("--engine-compile", choices=("none", "inductor"), default=None,
                        help="pytest's --engine-compile for every detector session: inductor runs "
                             "the detectors' engines on the compiled path (EngineConfig.compile); "
                             "a fault planted into code that path never runs is reported not "
                             "applicable, with its reason. Default: not given (the eager ops)")
    faults.add_argument("--markdown", action="store_true", help="print the table as markdown")
    faults.add_argument("--json", type=Path, metavar="PATH", help="also write the run as JSON to PATH")
    faults.set_defaults(func=cmd_faults)

    repro = verbs.add_parser("repro", help="replay a reproduction file; exit 1 while it still fails")
    repro.add_argument("file", type=Path)
    repro.add_argument("--without-fault", action="store_true",
                       help="replay without the planted fault the file names")
    _emulate_cuda_option(repro, "replay")
    repro.set_defaults(func=cmd_repro)
    _add_explain(verbs)

    bench = verbs.add_parser("bench", help="run a benchmark from harness.bench",
                             description="Benchmarks: " + ", ".join(benchmarks()) + ". Each prints its "
                             "table and writes a file only where --output says.")
    bench.add_argument("name", help=f"one of: {', '.join(benchmarks())}; `harness bench NAME --help` "
                       "for its options")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(func=cmd_bench)
    parser.verb_names = tuple(verbs.choices)
    return parser


TOP_LEVEL_OPTIONS = ("-h", "--help", "--version")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Split by hand: argparse cannot take option-like strings as a trailing positional list.
    pytest_args: list[str] = []
    if argv[:1] == ["run"] and "--" in argv:
        cut = argv.index("--")
        argv, pytest_args = argv[:cut], argv[cut + 1:]
    parser = build_parser()
    if argv and argv[0].startswith("-") and argv[0] not in TOP_LEVEL_OPTIONS:
        # argparse would first complain that the verb is missing and never name the flag.
        print(f"harness: unknown option {argv[0]}; a verb comes first: harness VERB [options], "
              f"VERB one of {', '.join(parser.verb_names)} (see harness --help)", file=sys.stderr)
        return 2
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help, --version, or a usage error already printed
        return stop.code if isinstance(stop.code, int) else 2
    args.pytest_args = pytest_args
    try:
        return args.func(args)
    except TestDbError as err:
        print(f"harness: {err}", file=sys.stderr)
        return 2
    except UsageError as error:
        return report_usage_error(" ".join(v for v in (args.verb, getattr(args, "family", None),
                                                      getattr(args, "action", None)) if v), error)
    except SystemExit as stop:  # a benchmark's own argparse
        return stop.code if isinstance(stop.code, int) else 2


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("capture-harness")
    except PackageNotFoundError:
        return "(not installed)"


if __name__ == "__main__":
    sys.exit(main())
