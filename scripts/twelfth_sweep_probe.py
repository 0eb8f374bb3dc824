"""CUDA's own answers for the cases of the twelfth sweep of public runtimes and bugs
(docs/fidelity.md, "A twelfth sweep of public runtimes and bugs"): half and bfloat16 kernels the
CPU build lacks called as their aten ops (directly, under the debug modes, from compiled code, in
place), the other kernels CUDA answers apart (histogram, integer histc, `mm.dtype`, lstsq's
driver, `one_hot`, `tensor_split`, `randint_like`, integer division by zero) as aten ops, a
reduce-overhead function replayed from two host threads, an event recorded again on
another device's stream, `use_mem_pool` inside a capture, a stream fork inside a reduce-overhead
function (PyTorch #180396), and the stream and event queries a capture refuses.

Plain torch, no harness: run it on a GPU, `python scripts/twelfth_sweep_probe.py` (all cases,
each in a process of its own) or with case names. Each case prints one line `case: answer`, with
the emulated device's answer in brackets where it is known to differ or was fixed; compare with
`python scripts/twelfth_sweep_probe.py --emulate` on a machine without a GPU."""

from __future__ import annotations

import sys
import threading

import probe_cases
import torch
import torch.nn.functional as F

CASES, case = probe_cases.registry()

_outcome = probe_cases.outcome
_aten = torch.ops.aten


def _close(out, reference) -> str:
    if not isinstance(out, torch.Tensor):
        return str(out)
    gap = (out.float() - reference.float()).abs().max().item()
    return f"{str(out.dtype).split('.')[-1]} gap {gap:.1e}"


@case
def reduced_kernels_as_aten_ops():
    """CUDA's half and bfloat16 kernels for avg_pool3d, the margin losses, rrelu and the
    antialiased upsamplings, called as the aten ops themselves (packet, overload, out=)."""
    answers = {}
    for dtype in (torch.float16, torch.bfloat16):
        x = probe_cases.seeded(1, 2, 4, 4, 4).to(dtype)
        pooled = F.avg_pool3d(x.float(), 2)
        image = probe_cases.seeded(1, 2, 8, 8, seed=1).to(dtype)
        scores = probe_cases.seeded(3, 5, seed=2).to(dtype)
        target = torch.tensor([1, 0, 4], device="cuda")
        given = torch.empty(0, device="cuda", dtype=dtype)
        name = str(dtype).split(".")[-1]
        answers[f"{name} avg_pool3d"] = _outcome(lambda: _close(_aten.avg_pool3d(x, [2, 2, 2]),
                                                                 pooled))
        answers[f"{name} avg_pool3d.out"] = _outcome(lambda: (
            _aten.avg_pool3d.out(x, [2, 2, 2], out=given) is given, _close(given, pooled)))
        answers[f"{name} avg_pool3d_backward"] = _outcome(lambda: _close(
            _aten.avg_pool3d_backward(torch.ones_like(pooled, dtype=dtype), x, [2, 2, 2],
                                      [2, 2, 2], [0, 0, 0], False, True, None),
            torch.full_like(x, 1 / 8)))
        answers[f"{name} multi_margin_loss"] = _outcome(lambda: _close(
            _aten.multi_margin_loss(scores, target), F.multi_margin_loss(scores.float(), target)))
        answers[f"{name} _upsample_bilinear2d_aa"] = _outcome(lambda: _close(
            _aten._upsample_bilinear2d_aa(image, [4, 4], False),
            F.interpolate(image.float(), size=(4, 4), mode="bilinear", antialias=True)))
    return (f"{answers} (emulated: each runs, gaps within the dtype's rounding; until "
            f"2026-12-08 NotImplementedError '... not implemented for Half')")


@case
def rrelu_in_place_in_half():
    """`rrelu_`, `F.rrelu(inplace=True)` and `rrelu_with_noise` write the tensors they are given."""
    answers = {}
    for name, call in (("torch.rrelu_", lambda t, n: torch.rrelu_(t, training=True)),
                       ("F.rrelu(inplace)", lambda t, n: F.rrelu(t, training=True, inplace=True)),
                       ("rrelu_with_noise", lambda t, n: _aten.rrelu_with_noise(
                           t, n, 0.125, 1 / 3, True))):
        x = -probe_cases.seeded(32).abs().half() - 0.5
        noise = torch.zeros(32, device="cuda").half()
        before = x.clone()
        out = call(x, noise)
        answers[name] = (f"returns its input {out is x}, input written "
                         f"{not torch.equal(x, before)}, noise written {bool(noise.any())}")
    return (f"{answers} (emulated: as CUDA's kernels; until 2026-12-08 torch.rrelu_ raised "
            f"'not implemented for Half', F.rrelu(inplace=True) returned a new tensor and left "
            f"its input, rrelu_with_noise left the noise)")


@case
def reduced_kernels_under_the_debug_modes():
    x = probe_cases.seeded(1, 2, 4, 4, 4).half()
    answers = {}
    torch.cuda.set_sync_debug_mode("warn")
    try:
        answers["sync debug"] = _outcome(lambda: F.avg_pool3d(x, 2).dtype)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        answers["deterministic"] = _outcome(lambda: F.avg_pool3d(x, 2).dtype)
    finally:
        torch.use_deterministic_algorithms(False)
    return f"{answers} (emulated: float16 both; until 2026-12-08 NotImplementedError both)"


@case
def reduced_kernel_in_aot_eager_code():
    x = probe_cases.seeded(1, 2, 4, 4, 4).half()
    compiled = torch.compile(lambda t: F.avg_pool3d(t, 2) * 2, backend="aot_eager")
    return (f"{_outcome(lambda: _close(compiled(x), F.avg_pool3d(x.float(), 2) * 2))} "
            f"(emulated: float16; until 2026-12-08 NotImplementedError from the graph's "
            f"aten.avg_pool3d.default)")


@case
def other_kernels_as_aten_ops():
    """The kernels CUDA answers apart from the CPU build, called as their aten ops."""
    ids = torch.tensor([0, 1, 1, 3], dtype=torch.int32, device="cuda")
    x = torch.arange(8.0, device="cuda")
    a, b = probe_cases.seeded(4, 8).half(), probe_cases.seeded(8, 2, seed=1).half()
    A, B = probe_cases.seeded(5, 3), probe_cases.seeded(5, 2, seed=1)
    dividend, divisor = torch.tensor([7, 6], device="cuda"), torch.tensor([0, 2], device="cuda")
    calls = {
        "histogram.bin_ct": lambda: _aten.histogram.bin_ct(x, 4),
        "histc of int32": lambda: _aten.histc(ids, 4, 0, 3).tolist(),
        "mm.dtype": lambda: _aten.mm.dtype(a, b, torch.float32).dtype,
        "linalg_lstsq gelsd": lambda: _aten.linalg_lstsq(A, B, driver="gelsd")[0].shape,
        "tensor_split of a device tensor": lambda: len(_aten.tensor_split(
            x, torch.tensor(2, device="cuda"))),
        "randint_like of a device high": lambda: _aten.randint_like.Tensor(
            x, torch.tensor(5, device="cuda")).shape,
        "floor_divide by zero": lambda: _aten.floor_divide(dividend, divisor).tolist(),
        "remainder.Tensor by zero": lambda: _aten.remainder.Tensor(dividend, divisor).tolist(),
        # last: on a GPU the device assert leaves the context unusable
        "one_hot of a class past num_classes": lambda: (_aten.one_hot(
            torch.tensor([0, 5], device="cuda"), 3), torch.cuda.synchronize()),
    }
    answers = {name: _outcome(call) for name, call in calls.items()}
    return (f"{answers} (emulated: histogram NotImplementedError (no CUDA kernel), histc "
            f"[1, 2, 0, 1], float32, RuntimeError (`driver` other than `gels`), RuntimeError "
            f"(on cpu), RuntimeError (on CPU), [0, 3], [4294967295, 0], a device assert; "
            f"until 2026-12-08 each took the CPU's kernel or check)")


@case
def reduce_overhead_from_two_threads():
    """inductor's cudagraphify keeps its trees' function per host thread."""
    def cubed(t):
        return t * t * t

    compiled = torch.compile(cubed, mode="reduce-overhead")
    x = probe_cases.seeded(64)
    for _ in range(3):
        held = compiled(x)
    seen = {}

    def worker():
        y = probe_cases.seeded(64, seed=1) + 5
        for step in range(3):
            seen[step] = _outcome(lambda: bool(torch.allclose(compiled(y), cubed(y))))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    kept = _outcome(lambda: bool(torch.allclose(held, cubed(x))))
    again = _outcome(lambda: compiled(x) is held)
    return (f"worker {seen}, main thread's output kept {kept}, its next replay the same "
            f"tensor {again} (emulated: all True; until 2026-12-08 the main thread's output "
            f"held the worker's values)")


@case
def event_recorded_again_on_another_device():
    if torch.cuda.device_count() < 2:
        return "needs two devices (emulated with device_count=2: the refusals below)"
    answers = {}
    for name, make in (("torch.cuda.Event", torch.cuda.Event), ("torch.Event", torch.Event)):
        event = make()
        event.record(torch.cuda.current_stream(1))
        answers[name] = _outcome(lambda: event.record(torch.cuda.current_stream(0)))
    return (f"{answers} (emulated: RuntimeError \"Event device 1 does not match recording "
            f"stream's device 0.\" and \"Event device index 1 does not match recording stream's "
            f"device index 0.\"; until 2026-12-08 both recorded)")


@case
def use_mem_pool_inside_a_capture():
    main_pool, side_pool = torch.cuda.MemPool(), torch.cuda.MemPool()
    x = probe_cases.seeded(1024)
    graph = torch.cuda.CUDAGraph()

    def step():
        y = x * 2
        with torch.cuda.use_mem_pool(side_pool):
            tmp = y.sin()
        return tmp + 1

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, pool=main_pool.id):
        out = step()
    answers = {"pools": _outcome(lambda: [tuple(p) for p in graph.pools()]),
               "use counts (main, side)": (main_pool.use_count(), side_pool.use_count()),
               "side segments": len(side_pool.snapshot())}
    x.fill_(1)
    graph.replay()
    torch.cuda.synchronize()
    answers["replay"] = bool(torch.allclose(out, torch.full_like(out, 2.0).sin() + 1))
    graph.reset()
    answers["use counts after reset"] = (main_pool.use_count(), side_pool.use_count())
    return (f"{answers} (emulated, 2.14.1: pools [main, side], use counts (2, 2), 2 side "
            f"segments (the warm-ups', the capture's), True, (1, 1); 2.13, whose use_mem_pool "
            f"retains nothing: pools [main] (2.13's own class may lack pools()), (2, 1))")


@case
def stream_fork_in_reduce_overhead():
    """PyTorch #180396 (fixed by #180916): a fork to a side stream and a join inside a
    reduce-overhead function."""
    side = torch.cuda.Stream()
    forked, joined = torch.cuda.Event(), torch.cuda.Event()

    def stream_fn(x, y):
        forked.record()
        with torch.cuda.stream(side):
            forked.wait()
            z = x * 2
            joined.record()
        joined.wait()
        return z + y

    x, y = probe_cases.seeded(100, 100), probe_cases.seeded(100, 100, seed=1)
    eager = stream_fn(x, y)
    compiled = torch.compile(stream_fn, mode="reduce-overhead")

    def run():
        for _ in range(3):
            out = compiled(x, y)
        torch.cuda.synchronize()
        return bool(torch.equal(out, eager))

    return f"{_outcome(run)} (emulated: True on 2.13 and 2.14.1)"


@case
def queries_inside_a_capture():
    x = probe_cases.seeded(64)
    other = torch.cuda.Stream()
    calls = {
        "capturing stream query": lambda: torch.cuda.current_stream().query(),
        "other stream query": other.query,
        "event recorded in capture, query": lambda: (lambda e: (e.record(), e.query()))(
            torch.cuda.Event()),
        "nvtx range": lambda: (torch.cuda.nvtx.range_push("a"), torch.cuda.nvtx.range_pop()),
        "torch.cuda.synchronize (relaxed)": torch.cuda.synchronize,
        "pin_memory of a new host tensor": lambda: torch.empty(4).pin_memory(),
    }
    answers = {}
    for name, call in calls.items():
        mode = "relaxed" if "relaxed" in name else "global"
        graph = torch.cuda.CUDAGraph()

        def body(call=call):
            x.mul(2)
            call()

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.mul(2)
        torch.cuda.current_stream().wait_stream(side)
        try:
            with torch.cuda.graph(graph, capture_error_mode=mode):
                body()
            answers[name] = "captured"
        except RuntimeError as error:
            answers[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:60]}"
    return (f"{answers} (emulated: the queries and the synchronize refused, the capture "
            f"invalidated; nvtx and pin_memory captured)")


if __name__ == "__main__":
    probe_cases.run(CASES, __file__, sys.argv[1:], answer=probe_cases.whole_answer)
