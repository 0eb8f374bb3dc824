"""The test-db verbs of the `harness` command: `run`, `testdb render | lists | check`, and the
options they share (machine facts; where the lists and the project they name are)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.cli_support import UsageError
from harness.testdb.schema import TERM_VALUES


def machine_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("machine facts (default: this machine, as torch sees it)")
    group.add_argument("--gpu-count", type=int, help="number of GPUs (default: torch.cuda.device_count())")
    group.add_argument("--gpu", help="GPU name matched by wildcards (default: torch.cuda.get_device_name(0))")
    group.add_argument("--stage", choices=TERM_VALUES["stage"], default="pre_merge", help="default: pre_merge")
    group.add_argument("--backend", choices=TERM_VALUES["backend"],
                       help="graph backend (default: cuda when available, else emulated)")
    project_options(parser)


def project_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--test-db", type=Path, help="folder of list files (default: test-db/ of the "
                        "nearest folder above the working directory that has one)")
    parser.add_argument("--rootdir", type=Path, help="the project the lines' paths are relative to "
                        "(default: the folder holding the test-db folder)")


def _machine(args):
    from harness.testdb import detect_machine

    return detect_machine(gpu_count=args.gpu_count, gpu=args.gpu, stage=args.stage, backend=args.backend)


def _project(args) -> tuple[Path, Path]:
    """(the project root the lists' paths are relative to, the test-db folder)."""
    from harness.testdb import project_root

    if args.test_db is not None:
        testdb = args.test_db.resolve()
        if not testdb.is_dir():
            raise UsageError(f"--test-db {args.test_db}: no such folder; expected a folder of *.yml lists")
        return (args.rootdir or testdb.parent).resolve(), testdb
    root = (args.rootdir or project_root()).resolve()
    return root, root / "test-db"


def _testdb_dir(args) -> Path:
    return _project(args)[1]


def cmd_run(args) -> int:
    from harness.testdb import get_list, run_list

    root, testdb = _project(args)
    test_list = get_list(testdb, args.name)
    extra = list(args.pytest_args)
    if args.hypothesis_profile:
        extra += ["--hypothesis-profile", args.hypothesis_profile]
    if args.hypothesis_seed is not None:
        extra += ["--hypothesis-seed", str(args.hypothesis_seed)]
    return run_list(test_list, _machine(args), root=root, results_dir=(args.results or root / "results").resolve(),
                    extra_args=tuple(extra), json_path=args.json, device=device_override(args))


def emulation_options(parser: argparse.ArgumentParser) -> None:
    from harness.device_options import RACE_MODES, SCHEDULES

    group = parser.add_argument_group(
        "the emulated CUDA device (a list's block states it with an emulate_cuda field; these win)")
    group.add_argument("--emulate-cuda", action="store_true",
                       help="run every line under the emulated CUDA device (pytest --emulate-cuda)")
    group.add_argument("--emulate-cuda-memory", metavar="SIZE",
                       help="its total memory, e.g. 8GiB (default: an H200's 141 GB)")
    group.add_argument("--emulate-cuda-name", metavar="NAME", help="its device name")
    group.add_argument("--emulate-cuda-count", metavar="N", help="how many devices (default 1)")
    group.add_argument("--cuda-schedule", choices=SCHEDULES, help="its stream schedule")
    group.add_argument("--cuda-races", choices=RACE_MODES, help="its race mode")


def device_override(args):
    """The emulated device `harness run` was told about; the options given replace the list's."""
    from harness.device_options import (
        RACE_MODES, SCHEDULES, DeviceOptionError, DeviceOverride, EmulatedDevice, parse_choice,
        parse_count, parse_size,
    )

    parsers = {"emulate_cuda_memory": ("total_memory", parse_size),
               "emulate_cuda_name": ("name", lambda v, where: v),
               "emulate_cuda_count": ("device_count", parse_count),
               "cuda_schedule": ("schedule", lambda v, where: parse_choice(v, SCHEDULES, where=where)),
               "cuda_races": ("races", lambda v, where: parse_choice(v, RACE_MODES, where=where))}
    fields = {}
    try:
        for dest, (field, parse) in parsers.items():
            value = getattr(args, dest, None)
            if value is not None:
                fields[field] = parse(value, where="--" + dest.replace("_", "-"))
    except DeviceOptionError as error:
        raise UsageError(str(error)) from None
    return DeviceOverride(EmulatedDevice(**fields), tuple(fields), bool(getattr(args, "emulate_cuda", False)))


def cmd_render(args) -> int:
    from harness.testdb import get_list, render_lines, select
    from harness.testdb.render import nothing_selected

    test_list = get_list(_testdb_dir(args), args.name)
    machine = _machine(args)
    lines = select(test_list, machine)
    if not lines:  # as `harness run` of the same list: a list that runs nothing is an error
        print(f"harness: {nothing_selected(test_list, machine)}", file=sys.stderr)
        return 2
    sys.stdout.write(render_lines(lines))
    return 0


def cmd_lists(args) -> int:
    from harness.testdb import load_lists

    for name, test_list in sorted(load_lists(_testdb_dir(args)).items()):
        print(f"{name}  ({test_list.source}, {sum(len(b.tests) for b in test_list.blocks)} lines)")
    return 0


def cmd_check(args) -> int:
    from harness.testdb import check_coverage, collect_node_ids, load_lists
    from harness.testdb.coverage import folders_named

    root, testdb = _project(args)
    lists = load_lists(testdb)
    folders = folders_named(lists)
    print(f"collecting {', '.join(folders)} under {root}", file=sys.stderr)
    report = check_coverage(lists, collect_node_ids(root, folders))
    print(report)
    return 0 if report.ok else 1
