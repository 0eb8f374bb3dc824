"""The dtypes `torch.autocast("cuda")` gives every OpInfo of PyTorch's op database, as one JSON file.

Run natively on a GPU and with `--emulate` (inside `harness.emulate_cuda()`), then compare the two
files with `--compare NATIVE EMULATED`: each op whose output dtypes (or error type) differ is
printed. The first sample input of each op is run in float16, bfloat16 and float32, without
autocast (the kernels each build has for a dtype) and under autocast in float16 and in bfloat16.
With `--capture` each op's first sample is captured in a CUDA graph instead (warmed on a side
stream, then replayed): "captured" with the output dtypes, or the error type and the first words
of its message, which on the emulated device begin with CUDA's own.

    python scripts/autocast_dtype_table.py OUT.json [--emulate] [--capture] [--only NAME ...]
    python scripts/autocast_dtype_table.py --compare NATIVE.json EMULATED.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings

import torch


def _dtypes(out) -> list:
    if isinstance(out, torch.Tensor):
        return [str(out.dtype).removeprefix("torch.")]
    if isinstance(out, (tuple, list)):
        return [d for o in out for d in _dtypes(o)]
    return []


def _capture_verdict(op, sample) -> str:
    """What a CUDA graph capture of the op makes of the sample: warmed on a side stream first."""
    def call():
        return op(sample.input, *sample.args, **sample.kwargs)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            call()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
    except Exception as error:
        return f"eager raises {type(error).__name__}"
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            out = call()
        graph.replay()
        torch.cuda.synchronize()
        return "captured " + " ".join(_dtypes(out))
    except Exception as error:
        # Under torch.cuda.graph a refused call is the context of capture_end's error.
        cause = error.__context__
        because = f" (after {type(cause).__name__}: {_first_words(cause)})" if cause else ""
        _settle_generators()
        return f"refused {type(error).__name__}: {_first_words(error)}{because}"


def _settle_generators() -> None:
    """Up to torch 2.11 a capture that ends invalidated leaves the device's generators capturing
    (every later draw fails with "Offset increment outside graph capture") until a capture ends
    well: one does, so the next op's sample is not refused for the op before it."""
    try:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            torch.ones(1, device="cuda").add_(1)
    except Exception as error:  # recorded where it is seen: the next rows' texts
        print(f"a settling capture failed: {type(error).__name__}: {_first_words(error)}")


def _first_words(error: BaseException) -> str:
    return " ".join(str(error).split())[:48]


def table(only: set[str], capture: bool = False) -> dict[str, str]:
    from torch.testing._internal.common_methods_invocations import op_db

    rows = {}
    for op in op_db:
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if only and name not in only:
            continue
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            try:
                if dtype not in op.supported_dtypes("cuda"):
                    continue
                torch.manual_seed(0)
                sample = next(iter(op.sample_inputs("cuda", dtype, requires_grad=False)))
            except Exception as error:  # the op database's own limits, recorded as such
                rows[f"{name}/{dtype}"] = f"no sample: {type(error).__name__}: {_first_words(error)}"
                continue
            if capture:
                rows[f"{name}/{str(dtype)[6:]}/capture"] = _capture_verdict(op, sample)
                continue
            for autocast_dtype in (None, torch.float16, torch.bfloat16):
                key = f"{name}/{str(dtype)[6:]}/{str(autocast_dtype).removeprefix('torch.')}"
                autocast = (torch.autocast("cuda", dtype=autocast_dtype) if autocast_dtype
                            else contextlib.nullcontext())
                try:
                    with autocast:
                        out = op(sample.input, *sample.args, **sample.kwargs)
                    rows[key] = " ".join(_dtypes(out))
                except Exception as error:
                    rows[key] = f"raises {type(error).__name__}"
    return rows


def compare(native_path: str, emulated_path: str) -> int:
    native = json.load(open(native_path))
    emulated = json.load(open(emulated_path))
    shared = sorted(set(native) & set(emulated))
    differing = [k for k in shared if native[k] != emulated[k]]
    for key in differing:
        print(f"{key}: native {native[key]!r}, emulated {emulated[key]!r}")
    print(f"{len(shared)} rows in both, {len(differing)} differ; only native "
          f"{len(set(native) - set(emulated))}, only emulated {len(set(emulated) - set(native))}")
    return 1 if differing else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?")
    parser.add_argument("--emulate", action="store_true")
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument("--capture", action="store_true",
                        help="each op's capture verdict instead of its autocast dtypes")
    parser.add_argument("--compare", nargs=2, metavar=("NATIVE", "EMULATED"))
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    warnings.simplefilter("ignore")
    context = contextlib.nullcontext()
    if args.emulate:
        import harness

        context = harness.emulate_cuda()
    with context:
        rows = table(set(args.only), capture=args.capture)
    json.dump(rows, open(args.out, "w"), indent=0, sort_keys=True)
    print(f"{len(rows)} rows, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
