"""Does CUDA capture work issued on a stream that was neither forked into nor joined from a capture?

suites/public_bugs/test_work_on_an_unforked_stream_in_capture.py says no: the side stream's kernel
runs once, at capture, and never at replay. On the H200 its replay equalled eager, but that run was
inside the graph sanitizer (the public_bugs conftest enters `harness.emulate_cuda()` on a GPU), whose
captures are emulated and record every stream's work. This probe uses torch.cuda alone and prints
the facts that decide it, per capture_error_mode:

- whether the side stream reports capturing while the capture is under way
  (`torch.cuda.is_current_stream_capturing()` inside `torch.cuda.stream(side)`, which asks
  cudaStreamIsCapturing of that stream);
- what the side kernel wrote during capture (run eagerly: 2 * the capture-time input);
- the replay's output after the input changed: 2 * new + 1 if the side kernel is in the graph,
  2 * capture-time input + 1 if it ran only at capture.

`--emulate` runs the same inside `harness.emulate_cuda()` for comparison (the graph sanitizer on a
GPU, the emulated device on a CPU). Under 30 s on a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch


def probe(mode: str) -> dict:
    side = torch.cuda.Stream()  # made before the capture, as a runtime's comm stream is
    capture_stream = torch.cuda.Stream()
    while capture_stream.cuda_stream == side.cuda_stream:  # pooled streams come round again
        capture_stream = torch.cuda.Stream()
    hidden = torch.arange(8, device="cuda", dtype=torch.float32) + 10  # the capture-time input
    scaled = torch.zeros(8, device="cuda")
    out = torch.zeros(8, device="cuda")
    graph = torch.cuda.CUDAGraph()
    facts: dict = {"mode": mode}
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=capture_stream, capture_error_mode=mode):
        facts["capture stream capturing"] = torch.cuda.is_current_stream_capturing()
        with torch.cuda.stream(side):
            facts["side stream capturing"] = torch.cuda.is_current_stream_capturing()
            torch.mul(hidden, 2, out=scaled)
        torch.add(scaled, 1, out=out)
    torch.cuda.synchronize()
    facts["scaled after capture"] = scaled.tolist()
    facts["out after capture"] = out.tolist()
    hidden.copy_(torch.arange(8, device="cuda", dtype=torch.float32))  # a new input
    scaled.zero_()
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    replayed = out.tolist()
    facts["replay out (new input 0..7)"] = replayed
    facts["side kernel in the graph"] = replayed == [2.0 * i + 1 for i in range(8)]
    facts["side kernel ran at capture only"] = scaled.tolist() == [0.0] * 8 and replayed == [1.0] * 8
    return facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--emulate", action="store_true",
                        help="inside harness.emulate_cuda(): the graph sanitizer on a GPU, the "
                             "emulated device on a CPU")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.emulate:
        parser.error("no CUDA device (pass --emulate to run it on the emulated device)")
    with contextlib.ExitStack() as stack:
        if args.emulate:
            import harness

            stack.enter_context(harness.emulate_cuda())
        results = []
        for mode in ("global", "thread_local", "relaxed"):
            try:
                results.append(probe(mode))
            except RuntimeError as error:
                results.append({"mode": mode, "error": str(error).splitlines()[0]})
    print(json.dumps({"torch": torch.__version__, "emulated": args.emulate}))
    for facts in results:
        print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
