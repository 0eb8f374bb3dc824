#!/usr/bin/env python3
"""Turn JUnit XML from the graph-contract suite into docs/fidelity.md: each contract case against
each backend (the emulator on CPU, real CUDA graphs on the GPU, the emulator on the GPU).

    pytest suites/graphs -p no:xdist --junitxml=cpu.xml            # on the CPU machine
    pytest suites/graphs -p no:xdist --junitxml=gpu.xml            # on the GPU machine
    python scripts/fidelity_table.py --cpu cpu.xml --gpu gpu.xml -o docs/fidelity.md

Test ids carry the backend as their first parameter (`[emulated]`, `[cuda]`, `[emulated-cuda]`,
see suites/graphs/conftest.py); a test without one is emulator-only. A column whose file was not
given reads "pending". Standard library only.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

# (column title, which file, backend id in the test id)
COLUMNS = (("emulated, CPU", "cpu", "emulated"),
           ("cuda, H200", "gpu", "cuda"),
           ("emulated, H200", "gpu", "emulated-cuda"))
BACKEND_IDS = ("emulated-cuda", "cuda", "emulated")  # longest first: ids are prefixes of each other
EMULATOR_ONLY = "emulator only"
# Tests of the suite's own tooling, not contract cases.
TOOLING_MODULES = frozenset({"test_bench", "test_fidelity_table"})
# Suites that run the reference runtime (and the adapters) on the --graph-backend they are given.
RUNTIME_SUITES = frozenset({"check", "ops", "model", "e2e", "decoder", "piecewise", "distributed",
                            "adapters", "examples", "repro", "faults"})


KNOWN_DIFFERENCES = """
## Known differences, by design

- The emulator refuses an `out=` of the wrong size and a `resize_` that changes a shape during
  capture; CUDA reallocates silently, so the graph then writes memory the caller no longer sees.
- A custom op's Python body does not run at capture on the emulator (capture runs nothing); CUDA
  runs it once at capture to record its kernels. Python side effects inside the op differ.
- On the emulator's cpu device host and device memory are one: `.cpu()` is invisible and a pageable
  `copy_` from a tensor made before capture captures. Tensors made during capture are told apart
  by how they were made (a factory given any device makes a device tensor, without one a host
  tensor): `torch.tensor(data, device=x.device)`, a host tensor moved to the device or mixed with
  device tensors are refused as on CUDA; a 0-dim host value is kept as a constant, with a warning.
  Until 2026-11-30 the emulator kept them all, and the H200 audit showed CUDA refusing transformers
  5.17's eager mask (`torch.tensor(0.0, device=mask.device)`, six architectures) and Phi-MoE's
  rotary frequencies rebuilt on the host (`inv_freq.to(x.device)`) where the emulator agreed.
- A CUDA kernel's own limits on its inputs are not modelled: the memory-efficient attention kernel
  that CUDA picks for an SDPA call with a mask refuses a mask broadcast along the key dimension
  (fp32: "(*bias): last dimension must be contiguous"; bf16: "misaligned address"), the CPU kernel
  takes it. transformers passes such a mask to BERT-style decoders only while capturing (in eager
  it drops the all-true mask after a data check that capture skips): the audit's one kind of
  differing row.
- External memory freed after capture: the emulator raises `FreedMemoryError` at replay, CUDA
  replays into whatever took the address (the cuda column shows the clobbering). 0-dim tensors
  built from host data during capture are held by the graph, not checked.
- Pool placement is the emulator's own best fit over 512-byte blocks in 1 MiB segments: reuse of
  freed blocks follows CUDA's caching allocator for the patterns above, not byte for byte.
- Random ops draw fresh values at every replay on both, from different generators. State changes
  made through a `torch.Generator` object's own methods during capture cannot be recorded: the
  emulator fails the capture when they changed the device generator's state (CUDA records them),
  and does not see them on other generators; `get_rng_state`/`set_rng_state` bound to a name before
  capture (`from torch import get_rng_state`) bypass the recording.
- Norm statistics on a cpu device follow the CPU kernel's dtype (bf16/fp16 for a reduced-precision
  input), not CUDA's float32: a graph's outputs match what the device itself returns.
- torch 2.11 only (the H200 machine): replaying cuDNN's fp16 batch norm with float32 parameters
  through the emulator on a cuda device trips torch's own `has_pyobject` internal assert (PyObject
  preservation), an xfail in that column; and in an earlier run an xdist worker died of a segfault
  inside Python's garbage collector during an emulated capture (the GPT-NeoX case on the CPU, and
  the failed-capture case on emulated-cuda). Neither came back in the final run, and neither was ever
  seen on torch 2.13. Suspected, not shown: the emulator's non-owning storages, which carry Python
  attributes, under torch 2.11's PyObject preservation.
- fp32 `torch._grouped_mm` without `offs` still fails on the emulator (torch's meta kernel takes
  bf16 only), where CUDA's fallback needs no host copy and captures.
"""


def split_backend(name: str) -> tuple[str, str | None]:
    """`test_x[cuda-item]` -> (`test_x[item]`, "cuda"); `test_y` -> (`test_y`, None)."""
    if not name.endswith("]") or "[" not in name:
        return name, None
    base, params = name[:-1].split("[", 1)
    for backend in BACKEND_IDS:
        if params == backend:
            return base, backend
        if params.startswith(backend + "-"):
            return f"{base}[{params[len(backend) + 1:]}]", backend
    return name, None


def outcome(case: ET.Element) -> str:
    for tag, word in (("failure", "FAILED"), ("error", "ERROR"), ("skipped", "skipped")):
        if case.find(tag) is not None:
            return word
    return "passed"


def read_results(path: Path) -> dict[tuple[str, str | None], str]:
    """(case id, backend id) -> outcome, for every testcase in one JUnit file."""
    results = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        if module in TOOLING_MODULES:
            continue
        name, backend = split_backend(case.get("name", ""))
        results[(f"{module}::{name}", backend)] = outcome(case)
    return results


def build_table(files: dict[str, dict[tuple[str, str | None], str]]) -> str:
    cases = sorted({case for results in files.values() for case, _ in results})
    emulator_only = {case for results in files.values() for case, backend in results
                     if backend is None}
    header = "| contract case | " + " | ".join(title for title, _, _ in COLUMNS) + " |"
    lines = [header, "|" + "---|" * (len(COLUMNS) + 1)]
    for case in cases:
        cells = []
        for _, source, backend in COLUMNS:
            results = files.get(source)
            if case in emulator_only and backend != "emulated":
                cells.append(EMULATOR_ONLY)
            elif results is None:
                cells.append("pending")
            else:
                cells.append(results.get((case, None if case in emulator_only else backend),
                                         "not run"))
        lines.append(f"| `{case}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def runtime_cases(paths: list[Path]) -> dict[str, str]:
    """`suite.module::case` -> outcome for the runtime suites' cases in JUnit files (merged)."""
    results = {}
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            classname = case.get("classname", "").removeprefix("suites.")
            if classname.split(".")[0] in RUNTIME_SUITES:
                results[f"{classname}::{case.get('name', '')}"] = outcome(case)
    return results


def runtime_table(cpu: list[Path], gpu: list[Path]) -> str:
    """The runtime suites, the emulator on the CPU beside real CUDA graphs on the GPU (the same test
    ids: the suites take the backend from --graph-backend)."""
    on_cpu, on_gpu = runtime_cases(cpu), runtime_cases(gpu)
    rows = [f"| `{case}` | {on_cpu.get(case, 'not run')} | {on_gpu.get(case, 'not run')} |"
            for case in sorted(set(on_cpu) | set(on_gpu))]
    return "\n".join(["| runtime case | emulated, CPU | cuda, H200 |", "|---|---|---|", *rows])


def render(files: dict[str, dict], sources: dict[str, str], runs: list[str],
           runtime: str | None = None) -> str:
    given = ", ".join(f"{k}: `{v}`" for k, v in sources.items()) or "none"
    provenance = "".join(f"- {line}\n" for line in runs)
    runtime_part = ("\n## The runtime suites on each backend\n\n"
                    "The reference runtime's suites (decode graphs, piecewise graphs, multirank, "
                    "the fault zoo's detectors, ...) and the adapters' suites, on the emulator on the "
                    "CPU and with `--graph-backend cuda` on the GPU. A `[nccl-cuda]` case needs two "
                    "GPUs and is skipped on the CPU.\n\n" + runtime + "\n") if runtime else ""
    return (
        "# Emulator fidelity\n\n"
        "Each case of the graph-contract suite (`suites/graphs/`) on each backend. A row that passes\n"
        "on `cuda, H200` and on `emulated, CPU` is a rule the emulator reproduces; a row that fails\n"
        "on one only is a fidelity gap. Generated by `scripts/fidelity_table.py` from JUnit XML\n"
        f"({given}); regenerate it rather than editing by hand:\n\n"
        "    pytest suites/graphs -p no:xdist --junitxml=cpu.xml   # CPU machine\n"
        "    pytest suites/graphs -p no:xdist --junitxml=gpu.xml   # GPU machine\n"
        "    python scripts/fidelity_table.py --cpu cpu.xml --gpu gpu.xml -o docs/fidelity.md\n\n"
        + (f"Runs:\n\n{provenance}\n" if provenance else "")
        + build_table(files) + "\n" + runtime_part + KNOWN_DIFFERENCES)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", type=Path, help="JUnit XML of suites/graphs on the CPU machine")
    parser.add_argument("--gpu", type=Path, help="JUnit XML of suites/graphs on the GPU machine")
    parser.add_argument("--runtime-cpu", type=Path, action="append", default=[],
                        help="JUnit XML of the runtime suites on the CPU (repeatable)")
    parser.add_argument("--runtime-gpu", type=Path, action="append", default=[],
                        help="JUnit XML of the runtime suites with --graph-backend cuda (repeatable: "
                             "the multirank run too)")
    parser.add_argument("--run", action="append", default=[],
                        help="a line saying where and when a run was made (date, commit, machine); repeatable")
    parser.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    args = parser.parse_args(argv)
    if args.cpu is None and args.gpu is None:
        parser.error("give --cpu, --gpu or both")
    files, sources = {}, {}
    for source in ("cpu", "gpu"):
        path = getattr(args, source)
        if path is None:
            continue
        if not path.is_file():
            parser.error(f"--{source} {path}: no such file")
        files[source], sources[source] = read_results(path), str(path.name)
    for path in (*args.runtime_cpu, *args.runtime_gpu):
        if not path.is_file():
            parser.error(f"{path}: no such file")
    runtime = runtime_table(args.runtime_cpu, args.runtime_gpu) if args.runtime_gpu else None
    text = render(files, sources, args.run, runtime)
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
