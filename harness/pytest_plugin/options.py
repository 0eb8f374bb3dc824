"""The harness's pytest options and ini keys, and what a session made of them: whether it uses the
harness, the emulated device it runs under (command line over ini), and refusals of options that
do not apply in the session, each a one-line usage error naming the option and why.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.device_options import (
    RACE_MODES, SCHEDULES, DeviceOptionError, EmulatedDevice,
    parse_choice, parse_count, parse_cuda_version, parse_size,
)
from harness.records import BACKENDS as BACKEND_CHOICES

USE_INI = "capture_harness"
DEFAULT_REPRO_DIR = "repro"
# (pytest option, its dest, the ini key, the EmulatedDevice field): the emulated device's settings.
DEVICE_SETTINGS = (
    ("--emulate-cuda-memory", "emulate_cuda_memory", "emulate_cuda_memory", "total_memory"),
    ("--emulate-cuda-name", "emulate_cuda_name", "emulate_cuda_name", "name"),
    ("--emulate-cuda-count", "emulate_cuda_count", "emulate_cuda_count", "device_count"),
    ("--emulate-cuda-version", "emulate_cuda_version", "emulate_cuda_version", "cuda_version"),
    ("--cuda-schedule", "cuda_schedule", "cuda_schedule", "schedule"),
    ("--cuda-races", "cuda_races", "cuda_races", "races"),
)
# The settings the graph sanitizer (--emulate-cuda on a GPU) takes too: emulate_cuda(races=).
SANITIZER_SETTINGS = ("--cuda-races",)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("capture-harness")
    group.addoption(
        "--graph-backend", choices=BACKEND_CHOICES, default="auto",
        help="graph backend for the graph_backend fixture: auto (cuda when available, else "
             "emulated), cuda, or emulated (CUDA-graph semantics on CPU). Default: auto.",
    )
    group.addoption(
        "--engine-compile", choices=("none", "inductor"), default=None,
        help="EngineConfig.compile for the engines the suites build where their config leaves it "
             "unset (the engine_defaults fixture): inductor runs them on the compiled path "
             "(inductor pieces between the attention ops); their eager baselines stay eager. "
             "Default: not given (the eager ops)",
    )
    group.addoption(
        "--emulate-cuda", action="store_true", default=False,
        help="run the whole session inside harness.emulate_cuda(): code written for CUDA runs "
             "unmodified (an emulated CUDA device on a machine without a GPU, the graph sanitizer "
             "on one); the device fixture is cuda and graph_backend captures through "
             "torch.cuda.graph. Ini: emulate_cuda = true",
    )
    group.addoption(
        "--emulate-cuda-memory", metavar="SIZE", default=None,
        help="with --emulate-cuda: the emulated device's total memory, e.g. 8GiB, 512MiB, 16GB "
             "(default: an H200's 141 GB). Ini: emulate_cuda_memory",
    )
    group.addoption("--emulate-cuda-name", metavar="NAME", default=None,
                    help="with --emulate-cuda: the emulated device's name. Ini: emulate_cuda_name")
    group.addoption("--emulate-cuda-count", metavar="N", default=None,
                    help="with --emulate-cuda: how many emulated devices (default 1). "
                         "Ini: emulate_cuda_count")
    group.addoption("--emulate-cuda-version", metavar="X.Y", default=None,
                    help="with --emulate-cuda on a CPU build of torch: torch.version.cuda reports X.Y "
                         "meanwhile (test files that gate CUDA-graph tests on it, such as PyTorch's "
                         "test_cuda.py, need it there; refused on a CUDA build). "
                         "Ini: emulate_cuda_version")
    group.addoption(
        "--cuda-schedule", choices=SCHEDULES, default=None,
        help="with --emulate-cuda: when the emulated device runs each stream's work: issue_order "
             "(at once, default) or adversarial (as late as synchronization allows, so a missing "
             "wait gives wrong values every time). Ini: cuda_schedule",
    )
    group.addoption(
        "--cuda-races", choices=RACE_MODES, default=None,
        help="with --emulate-cuda: what a race between streams and the host does: strict (raises "
             "RaceError at the second access, default), report (collected on the device state's "
             "streams_tracking.reports), off (no tracking); the same setting decides a replay that "
             "reads shared-pool memory another graph overwrote, the only thing it decides in the "
             "graph sanitizer (--emulate-cuda on a GPU). Ini: cuda_races",
    )
    group.addoption(
        "--plant-fault", metavar="NAME", default=None,
        help="plant the fault NAME of harness.faults.FAULTS for the whole session; the summary "
             "says how many times it fired (xdist workers' firings included)",
    )
    group.addoption(
        "--fault-report", metavar="PATH", type=Path, default=None,
        help="with --plant-fault: write {fault, fired, exitstatus} as JSON to PATH",
    )
    group.addoption(
        "--repro-dir", metavar="DIR", default=None,
        help=f"where a failing test of a harness session writes its reproduction file <test id>.json, "
             f"relative to the rootdir (default: {DEFAULT_REPRO_DIR}); 'none' writes nothing",
    )
    group.addoption(
        "--junit-part-of-run", action="store_true", default=False,
        help="this session's --junitxml file is one part of a `harness run`, which prints the "
             "merged file: pytest's own line naming the part is left out",
    )
    parser.addini(USE_INI, type="bool", default=False,
                  help="use the harness in every session of this project (its Hypothesis profile "
                       "ci by default, one torch thread per xdist worker, reproduction files, and "
                       "the short marker names gpu, slow, multirank, property)")
    parser.addini("emulate_cuda", type="bool", default=False,
                  help="run every session of this project under the emulated CUDA device, as --emulate-cuda")
    for option, _, ini, field in DEVICE_SETTINGS:
        parser.addini(ini, default="", help=f"the emulated device's {field}, as {option}; "
                                            f"the command line wins")


def named_on_command_line(config: pytest.Config, option: str) -> bool:
    words = [*config.invocation_params.args, *shlex.split(os.environ.get("PYTEST_ADDOPTS", "")),
             *config.getini("addopts")]
    return any(str(word) == option or str(word).startswith(option + "=") for word in words)


def opted_in(config: pytest.Config) -> bool:
    """The project asked for the harness in its ini (`capture_harness = true`)."""
    return bool(config.getini(USE_INI))


def emulating(config: pytest.Config) -> bool:
    return bool(config.getoption("emulate_cuda", default=False) or config.getini("emulate_cuda"))


def uses_harness_by_configuration(config: pytest.Config) -> bool:
    """The session asked for the harness before collection: a harness option or an ini setting."""
    return bool(opted_in(config) or named_on_command_line(config, "--graph-backend")
                or config.getoption("plant_fault") or config.getoption("fault_report")
                or emulating(config) or config.getoption("repro_dir"))


@dataclass(frozen=True)
class DeviceChoice:
    """The emulated device of a session, the command-line options that set it, and the ini keys
    that set something that does not apply here (reported in the header, not silently dropped)."""

    device: EmulatedDevice
    from_command_line: tuple[str, ...]  # the options given, e.g. ("--cuda-schedule",)
    ignored_ini: tuple[str, ...] = ()


def _parse(field: str, value, where: str):
    if field == "total_memory":
        return parse_size(value, where=where)
    if field == "device_count":
        return parse_count(value, where=where)
    if field == "cuda_version":
        return parse_cuda_version(value, where=where)
    if field == "schedule":
        return parse_choice(value, SCHEDULES, where=where)
    if field == "races":
        return parse_choice(value, RACE_MODES, where=where)
    return value


def device_choice(config: pytest.Config) -> DeviceChoice | None:
    """The emulated device the session runs under, or None without emulation. Refuses (UsageError)
    a device option given without --emulate-cuda and a value that cannot be parsed."""
    given = [(option, config.getoption(dest)) for option, dest, _, _ in DEVICE_SETTINGS
             if config.getoption(dest, default=None) is not None]
    if not emulating(config):
        if given:
            option, value = given[0]
            raise pytest.UsageError(
                f"{option} {value}: applies only to the emulated CUDA device, and this session does "
                f"not run under it; add --emulate-cuda (or emulate_cuda = true in the ini), or drop "
                f"{option}")
        return None
    fields = {}
    try:
        for option, dest, ini, field in DEVICE_SETTINGS:
            value = config.getoption(dest, default=None)
            if value is not None:
                fields[field] = _parse(field, value, option)
            elif config.getini(ini):
                fields[field] = _parse(field, config.getini(ini), f"ini {ini} =")
    except DeviceOptionError as error:
        raise pytest.UsageError(str(error)) from None
    return DeviceChoice(EmulatedDevice(**fields), tuple(option for option, _ in given))


def for_a_real_gpu(choice: DeviceChoice, config: pytest.Config) -> DeviceChoice:
    """On a machine with CUDA, --emulate-cuda is the graph sanitizer: of the emulated device's
    settings only the races mode applies there (it decides what a replay that reads memory CUDA
    reads silently does). The others, given on the command line, are refused; set in the ini (a
    project's CPU defaults) they are left out and named in the session header."""
    refused = [option for option in choice.from_command_line if option not in SANITIZER_SETTINGS]
    if refused:
        option = refused[0]
        raise pytest.UsageError(
            f"{option} {config.getoption(_dest(option))}: this machine has CUDA, so --emulate-cuda "
            f"runs the graph sanitizer on the real GPU, whose streams, races and memory are its "
            f"own; drop {option} (it applies to the emulated device on a machine without CUDA)")
    ignored = tuple(f"{ini} = {config.getini(ini)}" for option, _, ini, _ in DEVICE_SETTINGS
                    if option not in SANITIZER_SETTINGS and config.getini(ini))
    kept = tuple(option for option in choice.from_command_line if option in SANITIZER_SETTINGS)
    return DeviceChoice(EmulatedDevice(races=choice.device.races), kept, ignored)


def _dest(option: str) -> str:
    return next(dest for opt, dest, _, _ in DEVICE_SETTINGS if opt == option)


def check_backend_option(name: str, *, cuda_available: bool) -> None:
    """Refuse a backend this machine cannot give before any test runs, naming the option."""
    if name == "cuda" and not cuda_available:
        import torch

        raise pytest.UsageError(
            f"--graph-backend cuda needs CUDA, but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}); use --graph-backend emulated or auto"
        )
