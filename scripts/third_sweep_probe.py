"""CUDA's own answers for the cases of the third sweep of public runtimes (docs/fidelity.md, "A third
sweep of public runtimes and bugs") that were decided from PyTorch's source, not measured.

Plain torch, no harness: run it on a GPU, `python scripts/third_sweep_probe.py` (all cases, each in
a process of its own, since a refused capture can leave CUDA's context unusable) or with case names.
Each case prints one line `case: answer`; compare with the emulated device's answers, printed by
`python scripts/third_sweep_probe.py --emulate` on a machine without a GPU."""

from __future__ import annotations

import contextlib
import sys
import threading

import probe_cases
import torch

CASES, case = probe_cases.registry()


def _captured(body, mode: str = "global") -> str:
    x = torch.ones(8, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, capture_error_mode=mode):
            x.add_(1)
            body()
        graph.replay()
        torch.cuda.synchronize()
        return f"captured, x={x[0].item()}"
    except Exception as error:  # noqa: BLE001 (the probe reports whatever CUDA raised)
        return f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"


@case
def nvtx_range_start():
    first = torch.cuda.nvtx.range_start("probe")
    torch.cuda.nvtx.range_end(first)
    second = torch.cuda.nvtx.range_start("probe")
    torch.cuda.nvtx.range_end(second)
    return f"range_start answered {first}, then {second} (emulated: 0, then 0)"


@case
def external_stream_of_a_torch_stream():
    app = torch.cuda.Stream()
    x = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(app):
        torch.cuda._sleep(200_000_000)  # the write runs late
        x.fill_(2.0)
    wrapped = torch.cuda.ExternalStream(app.cuda_stream)
    with torch.cuda.stream(wrapped):
        y = x * 3  # ordered after the write if the wrapper is the same queue
    torch.cuda.synchronize()
    again = torch.cuda.ExternalStream(app.cuda_stream)
    return (f"read after the late write: {y[0].item()} (6.0 = one queue); wrapped == app: "
            f"{wrapped == app}; two wrappers equal: {wrapped == again}; stream_id "
            f"{wrapped.stream_id} vs {app.stream_id}")


@case
def external_stream_of_the_capturing_stream():
    side = torch.cuda.Stream()
    x, out = torch.ones(8, device="cuda"), torch.zeros(8, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        with torch.cuda.stream(torch.cuda.ExternalStream(side.cuda_stream)):
            out.copy_(x * 5)
    x.fill_(2.0)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    return f"replayed out={out[0].item()} (10.0: the wrapper's work was captured)"


@case
def external_stream_of_handle_zero():
    zero = torch.cuda.ExternalStream(0)
    return (f"== default stream: {zero == torch.cuda.default_stream()}; cuda_stream "
            f"{zero.cuda_stream:#x}")


@case
def out_of_memory_count_and_observer():
    heard = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: heard.append(args))
    before = torch.cuda.memory_stats()["num_ooms"]
    with contextlib.suppress(torch.OutOfMemoryError):
        torch.empty(1 << 45, device="cuda")
    after = torch.cuda.memory_stats()["num_ooms"]
    torch.cuda.set_per_process_memory_fraction(0.01)
    with contextlib.suppress(torch.OutOfMemoryError):
        torch.empty(int(torch.cuda.mem_get_info()[1] * 0.02) // 4, device="cuda")
    torch.cuda.set_per_process_memory_fraction(1.0)
    return (f"num_ooms {before} -> {after}, then {torch.cuda.memory_stats()['num_ooms']}; "
            f"observer args {heard}; mem_get_info total {torch.cuda.mem_get_info()[1]}")


@case
def current_blas_handle_allocates_its_workspace():
    with torch.cuda.stream(torch.cuda.Stream()):
        before = torch.cuda.memory_allocated()
        handle = torch.cuda.current_blas_handle()
        grew = torch.cuda.memory_allocated() - before
    return f"handle nonzero: {handle != 0}; memory_allocated grew by {grew}"


@case
def cufft_plan_cache():
    cache = torch.backends.cuda.cufft_plan_cache
    before = (cache.size, cache.max_size)
    torch.fft.rfft(torch.randn(64, device="cuda"))
    return f"(size, max_size) before {before}, after an rfft {(cache.size, cache.max_size)}"


@case
def pinned_allocation_in_the_capturing_thread():
    return _captured(lambda: torch.empty(1 << 20, pin_memory=True))


def _pinned_from_another_thread(mode: str) -> str:
    result = {}

    def body():
        def pin():
            try:
                torch.empty(1 << 20, pin_memory=True)
                result["thread"] = "ok"
            except Exception as error:  # noqa: BLE001
                result["thread"] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
        worker = threading.Thread(target=pin)
        worker.start()
        worker.join()

    return f"capture: {_captured(body, mode)}; thread: {result.get('thread')}"


@case
def pinned_allocation_in_another_thread_global():
    return _pinned_from_another_thread("global")


@case
def pinned_allocation_in_another_thread_thread_local():
    return _pinned_from_another_thread("thread_local")


@case
def rng_queries_inside_a_capture():
    return (f"get_rng_state: {_captured(torch.cuda.get_rng_state)}; initial_seed: "
            f"{_captured(torch.cuda.initial_seed)}")


@case
def debug_dump_without_a_kept_graph():
    import tempfile
    import warnings

    x = torch.ones(4, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.add_(1)
    path = tempfile.mktemp(suffix=".dot")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            graph.debug_dump(path)
            outcome = "returned"
        except Exception as error:  # noqa: BLE001
            outcome = f"{type(error).__name__}: {str(error)[:120]}"
    return f"{outcome}; warnings {[str(w.message)[:80] for w in caught]}"


@case
def use_mem_pool_of_none():
    try:
        with torch.cuda.use_mem_pool(None):
            pass
        return "accepted"
    except Exception as error:  # noqa: BLE001
        return f"{type(error).__name__}: {str(error)[:120]}"


if __name__ == "__main__":
    probe_cases.run(CASES, __file__, sys.argv[1:])
