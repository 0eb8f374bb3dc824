"""CUDA's own answers for the cases of the fourth sweep of public runtimes (docs/fidelity.md, "A
fourth sweep of public runtimes and bugs") that were decided from PyTorch's source or the CUDA
runtime's documentation, not measured, and the cases whose CUDA answer is not known here.

Plain torch, no harness: run it on a GPU, `python scripts/fourth_sweep_probe.py` (all cases, each in
a process of its own, since a refused capture can leave CUDA's context unusable) or with case names.
Each case prints one line `case: answer`; compare with the emulated device's answers, printed by
`python scripts/fourth_sweep_probe.py --emulate` on a machine without a GPU. The lines marked
"(unknown)" print what CUDA does where the emulated device's answer is a guess or a refusal."""

from __future__ import annotations

import sys
import threading

import probe_cases
import torch

CASES, case = probe_cases.registry()

_outcome = probe_cases.outcome


class Int8Rows(torch.Tensor):
    """A torchao-style weight: int8 values and a scale per row, dequantized in its dispatch."""

    @staticmethod
    def __new__(cls, values, scales):
        return torch.Tensor._make_wrapper_subclass(cls, values.shape, dtype=scales.dtype,
                                                   device=values.device)

    def __init__(self, values, scales):
        self.values, self.scales = values, scales

    def __tensor_flatten__(self):
        return ["values", "scales"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return Int8Rows(inner["values"], inner["scales"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.ops.aten.detach.default, torch.ops.aten.clone.default):
            return Int8Rows(func(args[0].values), func(args[0].scales))
        if func is torch.ops.aten._to_copy.default:
            moved = {k: v for k, v in kwargs.items() if k != "dtype"}
            return Int8Rows(func(args[0].values, **moved), func(args[0].scales, **kwargs))
        plain = [a.values.to(a.scales.dtype) * a.scales[:, None] if isinstance(a, Int8Rows)
                 else a for a in args]
        return func(*plain, **kwargs)


def _weight():
    gen = torch.Generator().manual_seed(0)
    values = torch.randint(-100, 100, (16, 16), dtype=torch.int8, generator=gen)
    return values, torch.rand(16, generator=gen) / 50


@case
def wrapper_subclass_is_a_device_tensor():
    values, scales = _weight()
    weight = Int8Rows(values, scales).cuda()
    x = torch.randn(4, 16, device="cuda")
    y = torch.nn.functional.linear(x, weight)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    Int8Rows(weight.values, weight.scales)
    return (f"is_cuda {weight.is_cuda}, inner is_cuda {weight.values.is_cuda}, linear right "
            f"{torch.allclose(y.cpu(), x.cpu() @ (values.float() * scales[:, None]).t(), atol=1e-4)}"
            f", a wrapper allocates {torch.cuda.memory_allocated() - before} bytes "
            f"(emulated: True, True, True, 0)")


@case
def wrapper_subclass_compiled_reduce_overhead():
    values, scales = _weight()
    linear = torch.nn.Linear(16, 16, bias=False)
    linear.weight = torch.nn.Parameter(Int8Rows(values, scales), requires_grad=False)
    linear = linear.cuda()
    step = torch.compile(linear, mode="reduce-overhead")
    weight = values.float() * scales[:, None]
    right = []
    for _ in range(4):
        x = torch.randn(4, 16, device="cuda")
        right.append(torch.allclose(step(x).cpu(), x.cpu() @ weight.t(), atol=1e-4))
    return f"each call right: {right} (emulated: all True)"


@case
def interprocess_event_with_timing():
    return (f"record: {_outcome(lambda: torch.cuda.Event(enable_timing=True, interprocess=True).record())}"
            f" (emulated: AcceleratorError: CUDA error: invalid argument)")


@case
def interprocess_event_handle():
    event = torch.cuda.Event(interprocess=True)
    event.record()
    handle = _outcome(lambda: len(event.ipc_handle()))
    opened = _outcome(lambda: torch.cuda.Event.from_ipc_handle(0, event.ipc_handle()).query())
    return (f"ipc_handle: {handle}; from_ipc_handle in the same process: {opened} (unknown; "
            f"emulated: NotImplementedError, one process)")


@case
def external_events_timing_inside_a_graph():
    side = torch.cuda.Stream()
    x = torch.ones(1 << 20, device="cuda")
    start = torch.cuda.Event(enable_timing=True, external=True)
    end = torch.cuda.Event(enable_timing=True, external=True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        start.record()
        x.mul_(2)
        end.record()
    graph.replay()
    end.synchronize()
    return (f"elapsed_time after a replay: {_outcome(lambda: start.elapsed_time(end) >= 0)} "
            f"(emulated: ok True)")


def _other_thread_on_the_capturing_stream(mode: str) -> str:
    side = torch.cuda.Stream()
    x, out = torch.ones(4, device="cuda"), torch.zeros(4, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()

    def work():
        with torch.cuda.stream(side):
            out.copy_(x * 3)

    def capture():
        with torch.cuda.graph(graph, stream=side, capture_error_mode=mode):
            worker = threading.Thread(target=work)
            worker.start()
            worker.join()
        out.zero_()
        x.fill_(2.0)
        graph.replay()
        torch.cuda.synchronize()
        return out.tolist()

    return f"{_outcome(capture)} (emulated: ok [6.0, 6.0, 6.0, 6.0])"


@case
def another_thread_on_the_capturing_stream_global():
    return _other_thread_on_the_capturing_stream("global")


@case
def another_thread_on_the_capturing_stream_thread_local():
    return _other_thread_on_the_capturing_stream("thread_local")


@case
def expandable_segments_statistics():
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    t = torch.empty(30 << 20, dtype=torch.uint8, device="cuda")
    grew = torch.cuda.memory_reserved() - before
    segments = [(s["segment_type"], s["total_size"], s["is_expandable"])
                for s in torch.cuda.memory_snapshot() if s["is_expandable"]]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = t[:16].float() * 2
    pool = [(s["total_size"], s["is_expandable"]) for s in torch.cuda.memory_snapshot()
            if s["segment_pool_id"] == graph.pool()]
    del y
    return (f"30 MiB reserved {grew} bytes; expandable segments {segments[:3]}; graph pool "
            f"segments {pool} (unknown; emulated: CUDA's default segments, a warning)")


if __name__ == "__main__":
    probe_cases.run(CASES, __file__, sys.argv[1:], answer=_outcome)
